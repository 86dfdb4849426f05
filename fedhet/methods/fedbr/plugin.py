"""Registers fedbr with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.fedbr.config import FedBRConfig
from fedhet.plugin import Method

METHOD = Method(
    "fedbr",
    configs=(FedBRConfig,),
    stages=("fedhet.methods.fedbr.pseudo_stage",),
)
