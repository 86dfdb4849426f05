"""Registers fedmix with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.fedmix.config import FedMixConfig
from fedhet.plugin import Method

METHOD = Method(
    "fedmix",
    configs=(FedMixConfig,),
)
