"""The `partition` stage: per-client index arrays and the clients x classes label histogram.
With `data.validation` the clients' arrays are their training samples (the histogram counts
those) and `validation/indices`, `validation/offsets` hold what each holds out
(fedhet.data.validation); with `data.server`, `server/indices` the server's samples
(fedhet.data.server_split). Its node is planned by fedhet.data.partition_plan."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import zarr

from fedhet.core.pipeline import RunContext, StageNode, stage
from fedhet.core.spec import Spec
from fedhet.core.store import create_array
from fedhet.data.datasets import load_data
from fedhet.data.partition import Partition, make_partition
from fedhet.data.server_split import on_pool, server_indices
from fedhet.data.validation import hold_out


@stage("partition")
def run(node: StageNode, ctx: RunContext, out: zarr.Group, partial: Path) -> None:
    save_partition(out, spec_partition(ctx.spec))


def spec_partition(spec: Spec) -> Partition:
    """The partition a spec asks for, its validation split applied: what the stage stores."""
    dataset = load_data(spec.data, seed=spec.seed)
    labels = dataset.train_y.numpy()
    if spec.data.server is None:
        part = make_partition(
            spec.partition, labels, dataset.num_classes, spec.seed, dataset.train_client
        )
    else:  # the clients partition what the server's share leaves
        server, pool = server_indices(len(labels), spec.data.server, spec.seed)
        ids = None if dataset.train_client is None else dataset.train_client[pool]
        part = make_partition(spec.partition, labels[pool], dataset.num_classes, spec.seed, ids)
        part = on_pool(part, pool)
    if spec.data.validation is not None:
        part = hold_out(part, labels, spec.data.validation, spec.seed)
    if spec.data.server is not None:
        part = replace(part, server_indices=server)
    return part


def save_partition(out: zarr.Group, part: Partition) -> None:
    save_index_lists(out, part.client_indices)
    create_array(out, "histogram", data=part.histogram.astype(np.int64))
    if part.angles is not None:
        create_array(out, "angles", data=np.asarray(part.angles, dtype=np.float64))
    if part.validation_indices is not None:
        save_index_lists(out, part.validation_indices, "validation/")
    if part.server_indices is not None:
        create_array(out, "server/indices", data=part.server_indices.astype(np.int64))


def save_index_lists(out: zarr.Group, lists: list[np.ndarray], prefix: str = "") -> None:
    """Index arrays, one per client, as `<prefix>indices` (concatenated) and `<prefix>offsets`."""
    sizes = np.array([len(i) for i in lists], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    indices = np.concatenate(lists).astype(np.int64)
    chunk = max(1, min(len(indices), 1 << 16))
    create_array(out, f"{prefix}indices", data=indices, chunks=(chunk,))
    create_array(out, f"{prefix}offsets", data=offsets)


def load_index_lists(group: zarr.Group) -> list[np.ndarray]:
    indices, offsets = group["indices"][:], group["offsets"][:]
    return [indices[offsets[k] : offsets[k + 1]] for k in range(len(offsets) - 1)]


def load_partition(group: zarr.Group) -> Partition:
    angles = group["angles"][:] if "angles" in group else None
    validation = load_index_lists(group["validation"]) if "validation" in group else None
    server = group["server"]["indices"][:] if "server" in group else None
    return Partition(load_index_lists(group), group["histogram"][:], angles, validation, server)
