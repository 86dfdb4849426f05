"""Registers fedprox with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.core.registry import Method
from fedhet.methods.fedprox.config import FedProxConfig

METHOD = Method(
    "fedprox",
    configs=(FedProxConfig,),
)
