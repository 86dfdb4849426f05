"""Registers fedtan with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.fedtan.config import (
    FedAvgAlgorithm2Config,
    FedBNConfig,
    FedTANConfig,
    FedTANIIConfig,
    SiloBNConfig,
)
from fedhet.plugin import Method

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
