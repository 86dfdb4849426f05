"""Registers fedavg with fedhet (entry point `fedhet.methods`)."""

from fedhet.core.registry import Method
from fedhet.methods.fedavg.algorithm import FedAvg

METHOD = Method("fedavg", algorithms=(FedAvg,))
