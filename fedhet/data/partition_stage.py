"""The `partition` stage: per-client index arrays and the clients x classes label histogram.
With `data.validation` the clients' arrays are their training samples (the histogram counts
those) and `validation/indices`, `validation/offsets` hold what each holds out
(fedhet.data.validation); with `data.server`, `server/indices` the server's samples
(fedhet.data.server_split). Its node is planned by fedhet.data.partition_plan."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import zarr

from fedhet.core.pipeline import RunContext, StageNode, stage
from fedhet.core.spec import Spec
from fedhet.data.datasets import load_data
from fedhet.data.heterogeneity import allowed_left_out, check_iid_labels, check_partition
from fedhet.data.partition import Partition, make_partition
from fedhet.data.partition_format import save_partition
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
    dealt = len(labels) if spec.data.server is None else len(pool)
    left_out = allowed_left_out(spec.partition, dealt)
    check_partition(shares(part), len(labels), left_out, "partition")
    check_iid_labels(spec.partition, part.histogram, "partition")
    return part


def shares(part: Partition) -> list:
    """Every index array a partition deals: the clients', the held-out and the server's."""
    held_out = part.validation_indices or []
    server = [] if part.server_indices is None else [part.server_indices]
    return [*part.client_indices, *held_out, *server]
