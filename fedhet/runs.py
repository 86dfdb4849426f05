"""From a spec to its runs: planning, running the missing stages, reading their results."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import zarr

from fedhet.core import divergence
from fedhet.core.errors import DivergedError, InputError
from fedhet.core.pipeline import RunContext, StageNode, ensure
from fedhet.core.spec import Spec, expand, partition_label
from fedhet.core.store import ArtifactStore
from fedhet.engine import (
    tensorboard,
    train_stage,  # noqa: F401  (registers the train and partition stages)
)
from fedhet.metrics.summary import summarize


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


# --- labels -------------------------------------------------------------------------------

# Spec fields that never tell two groups apart: labels, the matrix itself, runtime settings.
UNLABELLED = {"name", "description", "seed", "matrix", "runtime"}


def group_labels(runs: list[tuple[str, dict[str, Any], Spec]]) -> dict[str, tuple[str, str]]:
    """(algorithm, setting) label of every group, from (group, matrix axes, spec) of its runs.

    Each matrix axis that is one value throughout a group names it (`lr=0.1`, `mu=0.01`, the
    partition as in the papers' headers); where groups would still share both labels, every
    spec field that tells them apart is added to every group's labels (`clients=50`)."""
    members: dict[str, list[tuple[dict[str, Any], Spec]]] = {}
    for group, axes, spec in runs:
        members.setdefault(group, []).append((axes, spec))
    parts = {group: _axis_parts(runs) for group, runs in members.items()}
    specs = {group: runs[0][1] for group, runs in members.items()}
    flat = {group: _flat_fields(spec) for group, spec in specs.items()}
    for path in _distinguishing_fields(parts, specs):
        for group, (algorithm, setting) in parts.items():
            value = flat[group].get(path)
            if value is not None:
                side = algorithm if path.startswith("algorithm.") else setting
                side.append(_field_part(path, value))
    return _unique({group: _joined(*both) for group, both in parts.items()})


def _joined(algorithm: list[str], setting: list[str]) -> tuple[str, str]:
    return ", ".join(dict.fromkeys(algorithm)), ", ".join(dict.fromkeys(setting))


def _axis_parts(runs: list[tuple[dict[str, Any], Spec]]) -> tuple[list[str], list[str]]:
    """The algorithm and setting label parts of one group's matrix axes."""
    axes, spec = runs[0]
    algorithm, setting = [spec.algorithm.label()], []
    for axis, value in axes.items():
        if axis in ("seed", "algorithm", "algorithm.name"):  # the latter two: in label() above
            continue
        if any(other[axis] != value for other, _ in runs):  # not a property of the group
            continue
        side = algorithm if axis.startswith("algorithm.") else setting
        if axis == "partition":
            side.append(partition_label(spec.partition))
        elif isinstance(value, dict):
            side.extend(_field_part(f"{axis}.{k}", v) for k, v in value.items())
        else:
            side.append(_field_part(axis, value))
    return algorithm, setting or [partition_label(spec.partition)]


def _field_part(path: str, value: Any) -> str:
    """`lr=0.1` for federation.lr; the section name is left out, nested names kept."""
    return f"{path.split('.', 1)[-1]}={value}"


def _flat_fields(spec: Spec) -> dict[str, Any]:
    """`section.field.subfield` -> value of every field that can tell groups apart."""
    return _flatten(spec.model_dump(mode="json", serialize_as_any=True, exclude=UNLABELLED))


def varying_fields(specs: Sequence[Spec]) -> dict[str, list[Any]]:
    """`section.field` -> each spec's value (None where it has none), for every field (seed and
    runtime aside) whose value is not the same in all `specs`, in spec order."""
    flat = [_flat_fields(spec) for spec in specs]
    paths = dict.fromkeys(path for fields in flat for path in fields)
    return {
        path: [fields.get(path) for fields in flat]
        for path in paths
        if len({repr(fields.get(path)) for fields in flat}) > 1
    }


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for name, value in data.items():
        path = f"{prefix}{name}"
        flat.update(_flatten(value, f"{path}.") if isinstance(value, dict) else {path: value})
    return flat


def _distinguishing_fields(
    parts: dict[str, tuple[list[str], list[str]]], specs: dict[str, Spec]
) -> list[str]:
    """The fields that differ between groups that share both labels, in spec order."""
    sharing: dict[tuple[str, str], list[str]] = {}
    for group, both in parts.items():
        sharing.setdefault(_joined(*both), []).append(group)
    found: dict[str, None] = {}
    for groups in sharing.values():
        found.update(dict.fromkeys(varying_fields([specs[group] for group in groups])))
    return list(found)


def _unique(labels: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """Groups whose specs differ only where a key sees it but a label cannot (none is known)
    keep their own column all the same: the group's short key is added."""
    count = Counter(labels.values())
    return {
        group: (algorithm, setting if count[algorithm, setting] == 1 else f"{setting} {group[:8]}")
        for group, (algorithm, setting) in labels.items()
    }


def execute(run: Run, store: ArtifactStore) -> zarr.Group:
    if run.spec.runtime.tensorboard is not None:  # before anything is computed
        tensorboard.check_folder(run.spec.runtime.tensorboard, "runtime.tensorboard")
    context = RunContext(run.spec, store, labels=run.node_labels(), run_name=run.label)
    return ensure(run.node, context)


def result(run: Run, store: ArtifactStore, train: bool) -> zarr.Group:
    """The run's final artifact, computed (with whatever it needs) only when `train`. Raises
    the run's DivergedError when it diverged: without `train`, the one recorded in its stage's
    partial folder (fedhet.core.divergence), so that readers report it without training."""
    if train:
        return execute(run, store)
    if not store.exists(run.node.stage, run.node.key):
        diverged = stored_divergence(run, store)
        if diverged is not None:
            raise diverged
    return store.open(run.node.stage, run.node.key)


def stored_divergence(run: Run, store: ArtifactStore) -> DivergedError | None:
    """The divergence recorded when the run's stage last ran, else None."""
    return divergence.recorded(store.partial_dir(run.node.stage, run.node.key))


def require_stored(runs: list[Run], store: ArtifactStore, spec_path: str, shown: int = 5) -> None:
    """Raise InputError, in one line naming them, when some runs' results are not in the store
    (a run that diverged has its result: the divergence): commands that read results (eval,
    report) train only when asked to."""
    missing = [
        run
        for run in runs
        if not store.exists(run.node.stage, run.node.key) and not stored_divergence(run, store)
    ]
    if not missing:
        return
    names = [_missing_name(run, store) for run in missing[:shown]]
    if len(missing) > shown:
        names.append(f"{len(missing) - shown} more")
    raise InputError(
        f"{len(missing)} of {len(runs)} runs are not stored ({'; '.join(names)}); run "
        f"`fedhet train {spec_path}` first or pass --train"
    )


def _missing_name(run: Run, store: ArtifactStore) -> str:
    node = run.node
    kept = ", checkpoint kept" if store.partial_dir(node.stage, node.key).exists() else ""
    return f"{run.label} ({node.stage} {node.key[:12]}{kept})"


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
