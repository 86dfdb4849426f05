"""FedDyn (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021)."""
