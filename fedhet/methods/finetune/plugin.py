"""Registers finetune with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.finetune.config import FineTuneConfig
from fedhet.plugin import Method

METHOD = Method("finetune", configs=(FineTuneConfig,))
