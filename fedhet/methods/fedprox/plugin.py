"""Registers fedprox with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.core.registry import AlgorithmEntry, Method
from fedhet.methods.fedprox.config import FedProxConfig

METHOD = Method(
    "fedprox",
    algorithms=(AlgorithmEntry(FedProxConfig, "fedhet.methods.fedprox.algorithm:FedProx"),),
)
