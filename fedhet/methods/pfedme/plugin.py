"""Registers pfedme with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.pfedme.config import PFedMeConfig
from fedhet.plugin import Method

METHOD = Method("pfedme", configs=(PFedMeConfig,))
