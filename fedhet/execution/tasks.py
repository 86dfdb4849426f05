"""The scheduler's tasks: one per planned node of a spec's runs, deduplicated by key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedhet.core.pipeline import StageNode
from fedhet.core.spec import Spec
from fedhet.execution.planning import Run, plan


@dataclass(frozen=True)
class Task:
    """What a worker needs to compute one node. It travels to other processes as the run's
    spec (JSON), the identity of its data as planned here, and the node's key, and is planned
    again there (by `planning.plan`) on that identity."""

    node: StageNode
    spec: Spec  # the spec the node runs under
    run_spec: Spec  # the spec of the run that brought the node in
    store_root: str
    labels: dict[str, str]
    run_name: str | None  # the run whose final node this is; None for shared upstream nodes

    @property
    def key(self) -> str:
        return self.node.key

    def __reduce__(self):
        spec = self.run_spec.model_dump(mode="json", serialize_as_any=True)
        identity = self.run_spec.data.keyed_identity()
        return _replanned, (spec, identity, self.key, self.store_root, self.labels, self.run_name)


def _replanned(
    spec: dict,
    identity: dict[str, Any] | None,
    key: str,
    store_root: str,
    labels: dict[str, str],
    run_name: str | None,
) -> Task:
    run_spec = Spec.model_validate(spec)
    if identity is not None:  # a data file changed since: refused, naming it
        run_spec.data.adopt_identity(identity)
    return _tasks_below(plan(run_spec), run_spec, store_root, labels, run_name or "")[key]


def _tasks_below(
    final: StageNode, run_spec: Spec, store_root: str, labels: dict[str, str], run_name: str
) -> dict[str, Task]:
    """The task of a run's final node and of every node below it, upstream first, each with its
    node's spec (its own where it has one, else the nearest one above)."""
    tasks: dict[str, Task] = {}

    def visit(node: StageNode, spec: Spec, name: str | None) -> None:
        spec = node.spec or spec
        for up in node.upstream.values():
            visit(up, spec, None)
        tasks.setdefault(node.key, Task(node, spec, run_spec, store_root, labels, name))

    visit(final, run_spec, run_name)
    return tasks


def plan_tasks(runs: list[Run], store_root: str) -> dict[str, Task]:
    """Every planned node of the runs once (the first run that needs it brings it)."""
    tasks: dict[str, Task] = {}
    for run in runs:
        below = _tasks_below(run.node, run.spec, store_root, run.node_labels(), run.label)
        for key, task in below.items():
            tasks.setdefault(key, task)
    return tasks
