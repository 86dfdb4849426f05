"""Registers scaffold with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.core.registry import AlgorithmEntry, Method
from fedhet.methods.scaffold.config import ScaffoldConfig

METHOD = Method(
    "scaffold",
    algorithms=(AlgorithmEntry(ScaffoldConfig, "fedhet.methods.scaffold.algorithm:Scaffold"),),
)
