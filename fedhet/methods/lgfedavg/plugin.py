"""Registers lgfedavg with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.lgfedavg.config import LGFedAvgConfig
from fedhet.plugin import Method

METHOD = Method("lgfedavg", configs=(LGFedAvgConfig,))
