"""Registers fedavg with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.fedavg.config import FedAvgConfig
from fedhet.plugin import Method

METHOD = Method(
    "fedavg",
    configs=(FedAvgConfig,),
)
