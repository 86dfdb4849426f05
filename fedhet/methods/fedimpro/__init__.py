"""FedImpro: decoupled training with shared per-class feature statistics."""

from fedhet.methods.fedimpro.algorithm import FedImpro, FedImproConfig

__all__ = ["FedImpro", "FedImproConfig"]
