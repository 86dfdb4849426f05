"""Registers fednova with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.core.registry import AlgorithmEntry, Method
from fedhet.methods.fednova.config import FedNovaConfig

METHOD = Method(
    "fednova",
    algorithms=(AlgorithmEntry(FedNovaConfig, "fedhet.methods.fednova.algorithm:FedNova"),),
)
