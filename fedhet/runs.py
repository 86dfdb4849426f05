"""From a spec to its runs: planning, running the missing stages, reading their results."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import zarr

from fedhet.core import registry
from fedhet.core.pipeline import RunContext, StageNode, ensure
from fedhet.core.spec import Spec, expand, partition_label
from fedhet.core.store import ArtifactStore
from fedhet.engine import train_stage  # noqa: F401  (registers the train and partition stages)
from fedhet.metrics.summary import summarize


def plan(spec: Spec) -> StageNode:
    """The final stage node of a (matrix-free) spec; its upstream nodes hang below it."""
    return registry.algorithm(spec.algorithm.name).plan(spec)


@dataclass
class Run:
    axes: dict[str, Any]
    spec: Spec
    node: StageNode

    @property
    def algorithm_label(self) -> str:
        return self.spec.algorithm.label()

    @property
    def setting_label(self) -> str:
        parts = []
        for axis, value in self.axes.items():
            if axis.startswith("algorithm") or axis == "seed":
                continue
            if axis.startswith("partition"):
                parts.append(partition_label(self.spec.partition))
            else:
                parts.append(f"{axis.rsplit('.', 1)[-1]}={value}")
        return ", ".join(dict.fromkeys(parts)) or partition_label(self.spec.partition)


def runs_of(spec: Spec) -> list[Run]:
    return [Run(axes, s, plan(s)) for axes, s in expand(spec)]


def execute(run: Run, store: ArtifactStore) -> zarr.Group:
    return ensure(run.node, RunContext(run.spec, store))


def stored_metrics(group: zarr.Group) -> dict[str, list[float]]:
    return {name: arr[:].tolist() for name, arr in group["metrics"].arrays()}


def result_row(run: Run, metrics: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    summary = summarize(metrics, run.spec.eval.target_accuracy)
    return {
        "algorithm": run.algorithm_label,
        "setting": run.setting_label,
        "seed": run.spec.seed,
        **summary,
    }
