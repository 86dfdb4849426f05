"""Registers dann with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.dann.config import DANNConfig
from fedhet.plugin import Method

METHOD = Method(
    "dann",
    configs=(DANNConfig,),
)
