"""Registers VHL with fedhet (entry point `fedhet.methods`): an objective wrapper, so that
`algorithm: {name: fedavg, vhl: {...}}` trains any algorithm that accepts objectives with VHL."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedhet.core.registry import Method
from fedhet.methods.vhl import virtual_stage
from fedhet.methods.vhl.objective import VHLObjective, VHLSpec, extra_outputs

if TYPE_CHECKING:
    from fedhet.core.pipeline import StageNode
    from fedhet.core.spec import Spec
    from fedhet.engine.algorithm import TrainSetup


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


METHOD = Method("vhl", objectives=(VHL,))
