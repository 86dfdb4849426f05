"""Registers fednova with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.core.registry import Method
from fedhet.methods.fednova.config import FedNovaConfig

METHOD = Method(
    "fednova",
    configs=(FedNovaConfig,),
)
