"""Registers tct with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.core.registry import AlgorithmEntry, Method
from fedhet.methods.tct.config import TCTConfig

METHOD = Method(
    "tct",
    algorithms=(AlgorithmEntry(TCTConfig, "fedhet.methods.tct.algorithm:TCT"),),
    stages=(
        "fedhet.methods.tct.entk_stage",
        "fedhet.methods.tct.regress_stage",
    ),
)
