"""Registers fedprox with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.fedprox.config import FedProxConfig
from fedhet.plugin import Method

METHOD = Method(
    "fedprox",
    configs=(FedProxConfig,),
)
