"""LG-FedAvg (Liang et al., 2020): local representation layers, a global head."""
