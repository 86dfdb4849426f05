"""VHL as an objective wrapper (`fedhet.core.registry.ObjectiveWrapper`): what a run with
`algorithm.vhl` set needs from VHL (extra model outputs, the virtual-data stage, the objective)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedhet.methods.vhl import virtual_stage
from fedhet.methods.vhl.config import VHLSpec, extra_outputs
from fedhet.methods.vhl.objective import VHLObjective

if TYPE_CHECKING:
    from fedhet.core.pipeline import StageNode
    from fedhet.core.spec import Spec
    from fedhet.engine.setup import TrainSetup


class VHL:
    field = "vhl"
    Config = VHLSpec

    @staticmethod
    def extra_outputs(config: VHLSpec, num_classes: int) -> int:
        return extra_outputs(config, num_classes)

    @staticmethod
    def upstream(config: VHLSpec, spec: Spec) -> dict[str, StageNode]:
        return virtual_stage.virtual_upstream(spec)

    @staticmethod
    def build(config: VHLSpec, setup: TrainSetup, feature_dim: int) -> VHLObjective:
        return VHLObjective.for_setup(config, setup, feature_dim)
