"""FedImpro: decoupled training with shared per-class feature statistics."""
