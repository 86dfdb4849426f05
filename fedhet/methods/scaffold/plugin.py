"""Registers scaffold with fedhet (entry point `fedhet.methods`)."""

from fedhet.core.registry import Method
from fedhet.methods.scaffold.algorithm import Scaffold

METHOD = Method("scaffold", algorithms=(Scaffold,))
