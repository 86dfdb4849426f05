"""The labels of a spec's groups of runs (rows and columns of a report): what tells them apart."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from fedhet.core.sections import labelled
from fedhet.core.spec import Spec, partition_label
from fedhet.core.spec.overrides import flow_yaml

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
        for group, (_, algorithm, setting) in parts.items():
            value = flat[group].get(path)
            if value is not None:
                side = algorithm if path.startswith("algorithm.") else setting
                side.append(_field_part(path, value))
    return _unique({group: _joined(*both) for group, both in parts.items()})


def _joined(name: str, algorithm: list[str], setting: list[str]) -> tuple[str, str]:
    """The algorithm's label, its settings in its one parenthesis; the setting's label."""
    return labelled(name, list(dict.fromkeys(algorithm))), ", ".join(dict.fromkeys(setting))


def _axis_parts(runs: list[tuple[dict[str, Any], Spec]]) -> tuple[str, list[str], list[str]]:
    """The algorithm's name, its settings (its label's and the matrix axes') and the setting's
    label parts of one group."""
    axes, spec = runs[0]
    name, algorithm = spec.algorithm.label_parts()
    setting: list[str] = []
    for axis, value in axes.items():
        if axis in ("seed", "algorithm", "algorithm.name"):  # the latter two: in the name above
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
    return name, algorithm, setting or [partition_label(spec.partition)]


def _field_part(path: str, value: Any) -> str:
    """`lr=0.1` for federation.lr; the section name is left out, nested names kept, and a
    mapping or list written as the spec writes it (`local_epochs={low: 2, high: 5}`)."""
    shown = flow_yaml(value) if isinstance(value, dict | list) else value
    return f"{path.split('.', 1)[-1]}={shown}"


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
    parts: dict[str, tuple[str, list[str], list[str]]], specs: dict[str, Spec]
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


def named_label(given: str, labels: Sequence[str]) -> str | None:
    """The one of `labels` that `given` names: itself, else the one label equal to it but for
    case, spaces and punctuation, as labels were written before they took the papers' spelling
    (`fedavg(momentum 0.9)` names `FedAvg (momentum=0.9)`, `fedprox, mu=0.01` names
    `FedProx (mu=0.01)`); None when none, or several, do."""
    if given in labels:
        return given
    loose = list(dict.fromkeys(label for label in labels if _loose(label) == _loose(given)))
    return loose[0] if len(loose) == 1 else None


def _loose(label: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", label.lower())
