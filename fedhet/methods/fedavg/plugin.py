"""Registers fedavg with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.core.registry import AlgorithmEntry, Method
from fedhet.methods.fedavg.config import FedAvgConfig

METHOD = Method(
    "fedavg",
    algorithms=(AlgorithmEntry(FedAvgConfig, "fedhet.methods.fedavg.algorithm:FedAvg"),),
)
