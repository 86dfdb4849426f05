"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020): MAML's one-step adaptation, federated."""
