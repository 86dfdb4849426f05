"""Local training without communication: FedTAN's SingleNet, FedBR's Local (no paper of its own)."""
