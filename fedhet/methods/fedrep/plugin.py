"""Registers fedrep with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.fedrep.config import FedRepConfig
from fedhet.plugin import Method

METHOD = Method("fedrep", configs=(FedRepConfig,))
