"""Registers fedtan with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.core.registry import Method
from fedhet.methods.fedtan.config import (
    FedAvgAlgorithm2Config,
    FedBNConfig,
    FedTANConfig,
    FedTANIIConfig,
    SiloBNConfig,
)

METHOD = Method(
    "fedtan",
    configs=(
        FedTANConfig,
        FedAvgAlgorithm2Config,
        FedTANIIConfig,
        FedBNConfig,
        SiloBNConfig,
    ),
)
