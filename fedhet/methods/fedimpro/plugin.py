"""Registers fedimpro with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.core.registry import AlgorithmEntry, Method
from fedhet.methods.fedimpro.config import FedImproConfig

METHOD = Method(
    "fedimpro",
    algorithms=(AlgorithmEntry(FedImproConfig, "fedhet.methods.fedimpro.algorithm:FedImpro"),),
)
