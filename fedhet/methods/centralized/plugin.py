"""Registers centralized with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.core.registry import AlgorithmEntry, Method
from fedhet.methods.centralized.config import CentralizedConfig

METHOD = Method(
    "centralized",
    algorithms=(
        AlgorithmEntry(CentralizedConfig, "fedhet.methods.centralized.algorithm:Centralized"),
    ),
)
