"""FedTAN: federated learning with BatchNorm statistics and their gradients aggregated."""
