"""Registers scaffold with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.scaffold.config import ScaffoldConfig
from fedhet.plugin import Method

METHOD = Method(
    "scaffold",
    configs=(ScaffoldConfig,),
)
