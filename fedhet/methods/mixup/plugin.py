"""Registers mixup (FedAvg + Mixup) with fedhet (entry point `fedhet.methods`); imports no
torch."""

from fedhet.methods.mixup.config import MixupConfig
from fedhet.plugin import Method

METHOD = Method(
    "mixup",
    configs=(MixupConfig,),
)
