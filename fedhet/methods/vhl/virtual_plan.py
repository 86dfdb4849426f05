"""The `virtual` stage's node (no torch): what determines VHL's virtual images;
fedhet.methods.vhl.virtual_stage computes the artifact."""

from __future__ import annotations

from fedhet.core.pipeline import StageNode
from fedhet.core.spec import Spec
from fedhet.data.shapes import DATA_SHAPES
from fedhet.methods.vhl.config import VHLSpec, virtual_classes

VERSION = 1


def virtual_config(config: VHLSpec, spec: Spec) -> dict:
    shape, natural_classes = DATA_SHAPES[spec.data.dataset]
    return {
        "generator": config.generator.model_dump(mode="json"),
        "classes": virtual_classes(config, natural_classes),
        "shape": list(shape),
        "seed": config.seed if config.seed is not None else spec.seed,
    }


def virtual_node(config: VHLSpec, spec: Spec) -> StageNode:
    return StageNode("virtual", VERSION, virtual_config(config, spec))
