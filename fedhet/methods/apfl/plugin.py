"""Registers apfl with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.apfl.config import APFLConfig
from fedhet.plugin import Method

METHOD = Method("apfl", configs=(APFLConfig,))
