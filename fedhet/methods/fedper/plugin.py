"""Registers fedper with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.fedper.config import FedPerConfig
from fedhet.plugin import Method

METHOD = Method("fedper", configs=(FedPerConfig,))
