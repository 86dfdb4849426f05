"""The `partition` stage: per-client index arrays and the clients x classes label histogram.
Its node is planned by fedhet.data.partition_plan."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import zarr

from fedhet.core.pipeline import RunContext, StageNode, stage
from fedhet.data.datasets import load_dataset
from fedhet.data.partition import Partition, make_partition


@stage("partition")
def run(node: StageNode, ctx: RunContext, out: zarr.Group, partial: Path) -> None:
    data = ctx.spec.data
    dataset = load_dataset(data.dataset, data.root, data.download)
    part = make_partition(
        ctx.spec.partition, dataset.train_y.numpy(), dataset.num_classes, ctx.spec.seed
    )
    save_partition(out, part)


def save_partition(out: zarr.Group, part: Partition) -> None:
    save_index_lists(out, part.client_indices)
    out.create_array("histogram", data=part.histogram.astype(np.int64))
    if part.angles is not None:
        out.create_array("angles", data=np.asarray(part.angles, dtype=np.float64))


def load_partition(group: zarr.Group) -> Partition:
    angles = group["angles"][:] if "angles" in group else None
    return Partition(load_index_lists(group), group["histogram"][:], angles)


def save_index_lists(out: zarr.Group, lists: list[np.ndarray]) -> None:
    """One index array per client, as their concatenation (`indices`) and its `offsets`."""
    sizes = np.array([len(i) for i in lists], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    indices = np.concatenate(lists).astype(np.int64)
    out.create_array("indices", data=indices, chunks=(max(1, min(len(indices), 1 << 16)),))
    out.create_array("offsets", data=offsets)


def load_index_lists(group: zarr.Group) -> list[np.ndarray]:
    indices, offsets = group["indices"][:], group["offsets"][:]
    return [indices[offsets[k] : offsets[k + 1]] for k in range(len(offsets) - 1)]
