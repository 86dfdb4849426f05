"""Registers local with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.local.config import LocalConfig
from fedhet.plugin import Method

METHOD = Method(
    "local",
    configs=(LocalConfig,),
)
