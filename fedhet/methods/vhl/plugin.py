"""Registers VHL with fedhet (entry point `fedhet.methods`): an objective wrapper, so that
`algorithm: {name: fedavg, vhl: {...}}` trains any algorithm that accepts objectives with VHL.
Imports no torch: the wrapper (fedhet.methods.vhl.wrapper) is imported on first use."""

from fedhet.methods.vhl.config import VHLSpec
from fedhet.plugin import Method, ObjectiveEntry

METHOD = Method(
    "vhl",
    objectives=(ObjectiveEntry("vhl", VHLSpec, "fedhet.methods.vhl.wrapper:VHL"),),
    stages=("fedhet.methods.vhl.virtual_stage",),
    commands=("fedhet.methods.vhl.command:commands",),
)
