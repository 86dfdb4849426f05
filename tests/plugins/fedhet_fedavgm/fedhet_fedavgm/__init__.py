"""FedAvgM (Hsu et al., 2019): FedAvg with momentum on the server."""
