"""Registers fedtan with fedhet (entry point `fedhet.methods`)."""

from fedhet.core.registry import Method
from fedhet.methods.fedtan.algorithms import FEDTAN_ALGORITHMS

METHOD = Method("fedtan", algorithms=FEDTAN_ALGORITHMS)
