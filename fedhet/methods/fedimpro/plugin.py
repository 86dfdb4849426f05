"""Registers fedimpro with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.fedimpro.config import FedImproConfig
from fedhet.plugin import Method

METHOD = Method(
    "fedimpro",
    configs=(FedImproConfig,),
)
