"""Registers fedtan with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.core.registry import AlgorithmEntry, Method
from fedhet.methods.fedtan.config import (
    FedAvgAlgorithm2Config,
    FedBNConfig,
    FedTANConfig,
    FedTANIIConfig,
    SiloBNConfig,
)

METHOD = Method(
    "fedtan",
    algorithms=(
        AlgorithmEntry(FedTANConfig, "fedhet.methods.fedtan.algorithms:FedTAN"),
        AlgorithmEntry(FedAvgAlgorithm2Config, "fedhet.methods.fedtan.algorithms:FedAvgAlgorithm2"),
        AlgorithmEntry(FedTANIIConfig, "fedhet.methods.fedtan.algorithms:FedTANII"),
        AlgorithmEntry(FedBNConfig, "fedhet.methods.fedtan.algorithms:FedBN"),
        AlgorithmEntry(SiloBNConfig, "fedhet.methods.fedtan.algorithms:SiloBN"),
    ),
)
