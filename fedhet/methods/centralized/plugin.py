"""Registers centralized with fedhet (entry point `fedhet.methods`)."""

from fedhet.core.registry import Method
from fedhet.methods.centralized.algorithm import Centralized

METHOD = Method("centralized", algorithms=(Centralized,))
