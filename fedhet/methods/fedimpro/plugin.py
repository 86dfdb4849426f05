"""Registers fedimpro with fedhet (entry point `fedhet.methods`)."""

from fedhet.core.registry import Method
from fedhet.methods.fedimpro.algorithm import FedImpro

METHOD = Method("fedimpro", algorithms=(FedImpro,))
