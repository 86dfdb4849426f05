"""The distinct partitions of a spec's runs, each computed (or reused from the store) once."""

from __future__ import annotations

from collections.abc import Iterator

from rich.console import Console

from fedhet.core.pipeline import RunContext, StageNode, ensure
from fedhet.core.store import ArtifactStore
from fedhet.data.partition import Partition
from fedhet.data.partition_format import load_partition
from fedhet.execution.planning import Run


def partitions(
    runs: list[Run], store: ArtifactStore, console: Console
) -> Iterator[tuple[StageNode, str, Partition]]:
    """Each partition node the runs share, its label and its partition, in run order; each is
    computed when the iteration reaches it (its messages on `console`)."""
    seen = set()
    for run in runs:
        node = next(n for n in run.node.walk() if n.stage == "partition")
        if node.key in seen:
            continue
        seen.add(node.key)
        labels = run.node_labels()
        group = ensure(node, RunContext(run.spec, store, console, labels=labels))
        yield node, labels[node.key], load_partition(group)
