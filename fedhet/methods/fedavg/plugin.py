"""Registers fedavg with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.core.registry import Method
from fedhet.methods.fedavg.config import FedAvgConfig

METHOD = Method(
    "fedavg",
    configs=(FedAvgConfig,),
)
