"""Registers fedbabu with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.fedbabu.config import FedBABUConfig
from fedhet.plugin import Method

METHOD = Method("fedbabu", configs=(FedBABUConfig,))
