"""Registers fednova with fedhet (entry point `fedhet.methods`)."""

from fedhet.core.registry import Method
from fedhet.methods.fednova.algorithm import FedNova

METHOD = Method("fednova", algorithms=(FedNova,))
