"""Registers feddf with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.feddf.config import FedDFConfig
from fedhet.plugin import Method

METHOD = Method(
    "feddf",
    configs=(FedDFConfig,),
)
