"""FedNova (Wang et al., 2020)."""
