"""Registers feddyn with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.feddyn.config import FedDynConfig
from fedhet.plugin import Method

METHOD = Method(
    "feddyn",
    configs=(FedDynConfig,),
)
