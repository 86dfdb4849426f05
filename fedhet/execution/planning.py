"""From a spec to its runs, each planned once: its stage nodes, its group and its labels. The one
place a spec is planned (`plan`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedhet.core.pipeline import StageNode
from fedhet.core.spec import Spec, expand, partition_label
from fedhet.engine import train_stage  # noqa: F401  (registers the train and partition stages)
from fedhet.execution.labels import group_labels


def plan(spec: Spec) -> StageNode:
    """The final stage node of a (matrix-free) spec; its upstream nodes hang below it."""
    return spec.algorithm.plan(spec)


def group_key(spec: Spec) -> str:
    """The final stage's key with the seed fixed: the same for runs that differ only in their
    seed, and different for runs that differ in anything that enters a key."""
    return plan(spec.model_copy(update={"seed": 0})).key


@dataclass
class Run:
    axes: dict[str, Any]
    spec: Spec
    node: StageNode
    group: str  # group_key: a report averages over the runs of one group, never across groups
    algorithm_label: str  # the group's row in a report
    setting_label: str  # the group's column; the two together are unique per group

    @property
    def label(self) -> str:
        return f"{self.algorithm_label}, {self.setting_label}, seed {self.spec.seed}"

    def node_labels(self) -> dict[str, str]:
        """Key -> label of each of the run's stages: the run's label for its own stages, what
        the partition is for the partition (shared by every run with that data, split and seed)."""
        spec = self.spec
        split = (
            f"{spec.data.dataset} {partition_label(spec.partition)}, "
            f"{spec.partition.clients} clients, seed {spec.seed}"
        )
        labels = {
            node.key: split if node.stage == "partition" else f"{self.label} ({node.stage})"
            for node in self.node.walk()
        }
        return labels | {self.node.key: self.label}


def runs_of(spec: Spec) -> list[Run]:
    planned = [(axes, s, plan(s), group_key(s)) for axes, s in expand(spec)]
    labels = group_labels([(group, axes, s) for axes, s, _, group in planned])
    return [Run(axes, s, node, group, *labels[group]) for axes, s, node, group in planned]
