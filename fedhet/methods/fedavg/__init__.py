"""FedAvg (McMahan et al., 2017)."""
