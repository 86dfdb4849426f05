"""Registers tct with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.core.registry import Method
from fedhet.methods.tct.config import TCTConfig

METHOD = Method(
    "tct",
    configs=(TCTConfig,),
    stages=(
        "fedhet.methods.tct.entk_stage",
        "fedhet.methods.tct.regress_stage",
    ),
)
