"""FedAvg-FT: FedAvg, then each client fine-tunes the global model for k local steps."""
