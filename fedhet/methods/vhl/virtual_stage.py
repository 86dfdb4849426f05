"""The `virtual` stage: VHL's labeled virtual dataset, generated from noise once and shared.

The key holds only what determines the images: the generator config, the seed, the number of
virtual classes and the natural data's image shape. So every run with the same generator
config shares one artifact, whatever its partition, federation or algorithm. The artifact
holds `images` (N x C x H x W float32, class-major, standardized per channel) and `labels`
(N int64 virtual class indices 0..C_v-1).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import zarr
from pydantic import TypeAdapter

from fedhet.core.pipeline import RunContext, StageNode, stage
from fedhet.core.spec import Spec
from fedhet.data.shapes import DATA_SHAPES
from fedhet.methods.vhl.config import GeneratorSpec, VHLSpec, virtual_classes
from fedhet.methods.vhl.generators import generate

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


def virtual_upstream(spec: Spec) -> dict[str, StageNode]:
    """{"virtual": node} when the run's algorithm trains on virtual images, else {}."""
    config = getattr(spec.algorithm, "vhl", None)
    if config is None or not config.uses_images:
        return {}
    return {"virtual": virtual_node(config, spec)}


@stage("virtual")
def run(node: StageNode, ctx: RunContext, out: zarr.Group, partial: Path) -> None:
    cfg = node.config
    generator = TypeAdapter(GeneratorSpec).validate_python(cfg["generator"])
    images, labels = generate(
        generator.kind,
        cfg["classes"],
        generator.per_class,
        tuple(cfg["shape"]),
        cfg["seed"],
        **generator.options(),
    )
    chunks = (generator.per_class, *images.shape[1:])  # one chunk per class
    out.create_array("images", data=images.numpy(), chunks=chunks)
    out.create_array("labels", data=labels.numpy().astype(np.int64))


def load_virtual(group: zarr.Group) -> tuple[torch.Tensor, torch.Tensor]:
    """(images, labels) of a stored virtual dataset."""
    return torch.from_numpy(group["images"][...]), torch.from_numpy(group["labels"][...])
