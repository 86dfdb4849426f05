"""The federated training engine: round loop, local training, aggregation, checkpoints."""
