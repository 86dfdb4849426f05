"""Registers centralized with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.core.registry import Method
from fedhet.methods.centralized.config import CentralizedConfig

METHOD = Method(
    "centralized",
    configs=(CentralizedConfig,),
)
