"""The `partition` stage's node, known without loading data (planning imports no torch);
fedhet.data.partition_stage computes the artifact."""

from __future__ import annotations

from fedhet.core.pipeline import StageNode
from fedhet.core.spec import Spec

VERSION = 1


def partition_node(spec: Spec) -> StageNode:
    config = {
        "dataset": spec.data.dataset,
        "partition": spec.partition.model_dump(mode="json"),
        "seed": spec.seed,
    }
    if spec.data.validation is not None:  # absent when off: keys without a split stay as they were
        config["validation"] = spec.data.validation
    if spec.data.server is not None:  # absent when off, as validation
        config["server"] = spec.data.server
    identity = spec.data.keyed_identity()
    if identity is not None:  # what the data is besides its name, e.g. its file's hash
        config["data"] = identity
    return StageNode("partition", VERSION, config)
