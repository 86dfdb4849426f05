"""The `partition` stage: per-client index arrays and the clients x classes label histogram.
Its node is planned by fedhet.data.partition_plan."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import zarr

from fedhet.core.pipeline import RunContext, StageNode, stage
from fedhet.core.store import create_array
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
    sizes = np.array([len(i) for i in part.client_indices], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    indices = np.concatenate(part.client_indices).astype(np.int64)
    create_array(out, "indices", data=indices, chunks=(max(1, min(len(indices), 1 << 16)),))
    create_array(out, "offsets", data=offsets)
    create_array(out, "histogram", data=part.histogram.astype(np.int64))
    if part.angles is not None:
        create_array(out, "angles", data=np.asarray(part.angles, dtype=np.float64))


def load_partition(group: zarr.Group) -> Partition:
    indices, offsets = group["indices"][:], group["offsets"][:]
    clients = [indices[offsets[k] : offsets[k + 1]] for k in range(len(offsets) - 1)]
    angles = group["angles"][:] if "angles" in group else None
    return Partition(clients, group["histogram"][:], angles)
