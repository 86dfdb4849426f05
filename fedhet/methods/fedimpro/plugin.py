"""Registers fedimpro with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.core.registry import Method
from fedhet.methods.fedimpro.config import FedImproConfig

METHOD = Method(
    "fedimpro",
    configs=(FedImproConfig,),
)
