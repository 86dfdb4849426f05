"""Registers fedprox with fedhet (entry point `fedhet.methods`)."""

from fedhet.core.registry import Method
from fedhet.methods.fedprox.algorithm import FedProx

METHOD = Method("fedprox", algorithms=(FedProx,))
