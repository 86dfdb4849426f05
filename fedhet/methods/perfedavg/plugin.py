"""Registers perfedavg with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.perfedavg.config import PerFedAvgConfig
from fedhet.plugin import Method

METHOD = Method("perfedavg", configs=(PerFedAvgConfig,))
