"""FedProx (Li et al., 2020)."""
