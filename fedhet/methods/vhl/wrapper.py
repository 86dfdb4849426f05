"""VHL as an objective wrapper (`fedhet.core.registry.ObjectiveWrapper`): its config plans what a
run with `algorithm.vhl` set adds (extra model outputs, the virtual-data stage); this builds the
objective, imported on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedhet.methods.vhl.config import VHLSpec
from fedhet.methods.vhl.objective import VHLObjective

if TYPE_CHECKING:
    from fedhet.plugin import TrainSetup


class VHL:
    field = "vhl"
    Config = VHLSpec

    @staticmethod
    def build(config: VHLSpec, setup: TrainSetup, feature_dim: int) -> VHLObjective:
        return VHLObjective.for_setup(config, setup, feature_dim)
