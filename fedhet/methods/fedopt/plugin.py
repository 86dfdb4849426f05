"""Registers the FedOpt family with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.fedopt.config import (
    FedAdagradConfig,
    FedAdamConfig,
    FedAvgMConfig,
    FedYogiConfig,
)
from fedhet.plugin import Method

METHOD = Method(
    "fedopt",
    configs=(FedAdamConfig, FedYogiConfig, FedAdagradConfig, FedAvgMConfig),
)
