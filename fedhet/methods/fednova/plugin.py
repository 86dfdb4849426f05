"""Registers fednova with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.fednova.config import FedNovaConfig
from fedhet.plugin import Method

METHOD = Method(
    "fednova",
    configs=(FedNovaConfig,),
)
