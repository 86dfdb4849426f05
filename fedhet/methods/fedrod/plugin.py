"""Registers fedrod with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.fedrod.config import FedRoDConfig
from fedhet.plugin import Method

METHOD = Method("fedrod", configs=(FedRoDConfig,))
