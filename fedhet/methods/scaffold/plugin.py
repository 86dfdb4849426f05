"""Registers scaffold with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.core.registry import Method
from fedhet.methods.scaffold.config import ScaffoldConfig

METHOD = Method(
    "scaffold",
    configs=(ScaffoldConfig,),
)
