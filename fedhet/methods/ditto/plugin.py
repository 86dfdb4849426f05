"""Registers ditto with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.ditto.config import DittoConfig
from fedhet.plugin import Method

METHOD = Method("ditto", configs=(DittoConfig,))
