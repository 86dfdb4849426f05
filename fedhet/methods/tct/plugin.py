"""Registers tct with fedhet (entry point `fedhet.methods`); imports no torch."""

from fedhet.methods.tct.config import TCTConfig
from fedhet.plugin import Method

METHOD = Method(
    "tct",
    configs=(TCTConfig,),
    stages=(
        "fedhet.methods.tct.entk_stage",
        "fedhet.methods.tct.regress_stage",
    ),
)
