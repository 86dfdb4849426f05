"""Registers fedbr with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.core.registry import AlgorithmEntry, Method
from fedhet.methods.fedbr.config import FedBRConfig

METHOD = Method(
    "fedbr",
    algorithms=(AlgorithmEntry(FedBRConfig, "fedhet.methods.fedbr.algorithm:FedBR"),),
    stages=("fedhet.methods.fedbr.pseudo_stage",),
)
