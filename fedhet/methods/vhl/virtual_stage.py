"""The `virtual` stage: VHL's labeled virtual dataset, generated from noise once and shared.

The key holds only what determines the images: the generator config, the seed, the number of
virtual classes and the natural data's image shape. So every run with the same generator
config shares one artifact, whatever its partition, federation or algorithm. The artifact
holds `images` (N x C x H x W float32, class-major, in the node's scale: standardized per
channel unless `scale: clamp`) and `labels`
(N int64 virtual class indices 0..C_v-1). Its node is planned by
fedhet.methods.vhl.config (virtual_node).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import zarr
from pydantic import TypeAdapter

from fedhet.methods.vhl.config import GeneratorSpec
from fedhet.methods.vhl.generators import generate
from fedhet.plugin import RunContext, StageNode, create_array, stage


@stage("virtual")
def run(node: StageNode, ctx: RunContext, out: zarr.Group, partial: Path) -> None:
    cfg = node.config
    generator = TypeAdapter(GeneratorSpec).validate_python(cfg["generator"])
    scale = cfg.get("scale", "standardize")
    images, labels = generate(generator, cfg["classes"], tuple(cfg["shape"]), cfg["seed"], scale)
    chunks = (generator.per_class, *images.shape[1:])  # one chunk per class
    create_array(out, "images", data=images.numpy(), chunks=chunks)
    create_array(out, "labels", data=labels.numpy().astype(np.int64))


def load_virtual(group: zarr.Group) -> tuple[torch.Tensor, torch.Tensor]:
    """(images, labels) of a stored virtual dataset."""
    return torch.from_numpy(group["images"][...]), torch.from_numpy(group["labels"][...])
