"""The `label_skew` stage: how far each client's labels are from the whole federation's.

skew[k] = 1/2 sum_c |p_k(c) - p(c)| (total variation), p_k client k's label distribution and p
the federation's, from the partition's label histogram. It depends on the partition alone, so
every run on one partition shares the artifact, whatever its algorithm settings.
"""

from pathlib import Path

import numpy as np
import zarr

from fedhet.plugin import RunContext, Spec, StageNode, partition_node, stage

VERSION = 1


def label_skew_node(spec: Spec) -> StageNode:
    return StageNode("label_skew", VERSION, {}, {"partition": partition_node(spec)})


@stage("label_skew")
def run(node: StageNode, ctx: RunContext, out: zarr.Group, partial: Path) -> None:
    histogram = ctx.upstream(node, "partition")["histogram"][:].astype(np.float64)
    clients = histogram / np.maximum(histogram.sum(axis=1, keepdims=True), 1)
    federation = histogram.sum(axis=0) / histogram.sum()
    out.create_array("skew", data=0.5 * np.abs(clients - federation).sum(axis=1))
