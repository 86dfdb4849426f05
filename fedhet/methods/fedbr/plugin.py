"""Registers fedbr with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.core.registry import Method
from fedhet.methods.fedbr.config import FedBRConfig

METHOD = Method(
    "fedbr",
    configs=(FedBRConfig,),
    stages=("fedhet.methods.fedbr.pseudo_stage",),
)
