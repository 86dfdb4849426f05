"""Registers centralized with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.centralized.config import CentralizedConfig
from fedhet.plugin import Method

METHOD = Method(
    "centralized",
    configs=(CentralizedConfig,),
)
