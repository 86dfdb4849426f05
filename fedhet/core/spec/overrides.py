"""Command-line changes to a spec's mapping, applied before validation: overrides (PATH=VALUE)
and run filters (`--only AXIS=VALUE`).

An override always wins, never silently dropped. An override of a swept field (a matrix axis's
own path, a section holding it, or a field inside what it sets) replaces the axis: the axis is
dropped, every run takes the spec's value with the override applied (or the spec is refused
when that is invalid), and `replaced_axes` says so in one line. One entry of an axis is changed
by its 0-based index (`matrix.algorithm.3.stage2.lr=0.002`); `--only AXIS=VALUE` keeps the runs
whose axis has that value, changing none."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from fedhet.core.errors import InputError


@dataclass(frozen=True)
class Override:
    text: str  # as the user wrote it
    path: list[str]  # the field's path; a matrix axis is one dotted name: [matrix, axis]
    entry: int | None  # matrix.AXIS.INDEX[.FIELD...]: the entry's index, then its fields
    inner: list[str]  # the fields inside that entry
    value: Any

    @property
    def dotted(self) -> str:
        return ".".join(self.path)


def parse_override(override: str) -> Override:
    """`PATH=VALUE` with VALUE in YAML; InputError naming the override when malformed."""
    dotted, has_value, text = override.partition("=")
    parts = [part.strip() for part in dotted.strip().split(".")]
    if not has_value or not all(parts):
        raise InputError(
            f"override {override!r}: expected PATH=VALUE with a dotted PATH, "
            "e.g. federation.rounds=100"
        )
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise InputError(
            f"override {override!r}: the value is not valid YAML ({problem})"
        ) from None
    if parts[0] != "matrix" or len(parts) == 1:
        return Override(override, parts, None, [], value)
    index = next((i for i, part in enumerate(parts) if part.isdigit()), None)
    if index is None:
        return Override(override, ["matrix", ".".join(parts[1:])], None, [], value)
    axis = ".".join(parts[1:index])
    return Override(override, ["matrix", axis], int(parts[index]), parts[index + 1 :], value)


def override_path(override: str) -> list[str]:
    """The path an override sets (a matrix axis as one dotted name), for naming it in errors."""
    parsed = parse_override(override)
    extra = [] if parsed.entry is None else [str(parsed.entry), *parsed.inner]
    return parsed.path + extra


def apply_overrides(data: dict, overrides: Sequence[str]) -> dict:
    """A copy of a spec's mapping with each override applied in order (a VALUE replaces
    whatever the path held), the matrix axes they replace dropped (see the module's rule)."""
    if not isinstance(data, dict):
        raise InputError(f"a spec must be a YAML mapping, got {type(data).__name__}")
    data = copy.deepcopy(data)
    parsed = [parse_override(o) for o in overrides]
    matrix = data.get("matrix") if isinstance(data.get("matrix"), dict) else {}
    replaced = {axis for axis, _ in _replacements(matrix, parsed)}
    for override in parsed:
        if override.entry is None:
            _set(data, override)
        else:
            _set_entry(data, override)
    if replaced and isinstance(data.get("matrix"), dict):
        data["matrix"] = {a: v for a, v in data["matrix"].items() if a not in replaced} or None
    return data


def replaced_axes(data: dict, overrides: Sequence[str]) -> list[str]:
    """One line per matrix axis an override replaces, saying so."""
    matrix = data.get("matrix") if isinstance(data, dict) else None
    if not isinstance(matrix, dict):
        return []
    parsed = [parse_override(o) for o in overrides]
    return [
        f"override {override.text!r} replaces the matrix axis {axis} ({_count(matrix[axis])}): "
        "every run takes the overridden value"
        for axis, override in _replacements(matrix, parsed)
    ]


def _count(values: Any) -> str:
    n = len(values) if isinstance(values, list) else 1
    return f"{n} value{'s' if n != 1 else ''}"


def _replacements(matrix: dict, parsed: list[Override]) -> list[tuple[str, Override]]:
    """(axis, the first override replacing it): an override of the axis's path, of a section
    above it, or of a field inside what it sets (`algorithm.mu` when `algorithm` or
    `algorithm.name` is swept: each of the latter's values starts a fresh algorithm section)."""
    found = {}
    for override in parsed:
        if override.path[0] == "matrix":
            continue
        for axis in matrix:
            section = "algorithm" if axis == "algorithm.name" else axis
            above = axis == override.dotted or axis.startswith(override.dotted + ".")
            if above or override.dotted.startswith(section + "."):
                found.setdefault(axis, override)
    return list(found.items())


def _set(data: dict, override: Override) -> None:
    *parents, leaf = override.path
    node = data
    for depth, part in enumerate(parents):
        if node.get(part) is None:
            node[part] = {}
        node = node[part]
        if not isinstance(node, dict):
            where = ".".join(parents[: depth + 1])
            raise InputError(
                f"override {override.text!r}: {where} is a value, not a section; "
                f"set it whole ({where}=...)"
            )
    node[leaf] = override.value


def _set_entry(data: dict, override: Override) -> None:
    """`matrix.AXIS.INDEX[.FIELD...]=VALUE`: the entry itself, or a field inside it."""
    axis = override.path[1]
    matrix = data.get("matrix") if isinstance(data.get("matrix"), dict) else {}
    values = matrix.get(axis)
    if not isinstance(values, list):
        axes = ", ".join(matrix) or "none"
        raise InputError(
            f"override {override.text!r}: the matrix has no axis {axis}; its axes: {axes}"
        )
    if override.entry >= len(values):
        raise InputError(
            f"override {override.text!r}: matrix.{axis} has {len(values)} entries, "
            f"indexed 0 to {len(values) - 1}"
        )
    if not override.inner:
        values[override.entry] = override.value
        return
    entry = values[override.entry]
    if not isinstance(entry, dict):
        raise InputError(
            f"override {override.text!r}: entry {override.entry} of matrix.{axis} is a value, "
            f"not a section; set it whole (matrix.{axis}.{override.entry}=...)"
        )
    inner = Override(override.text, override.inner, None, [], override.value)
    _set(entry, inner)


def keep_only(data: dict, filters: Sequence[str]) -> dict:
    """A copy of a spec's mapping whose matrix axes keep only the values the `AXIS=VALUE`
    filters match (`_matches`: `algorithm=fedprox`, `partition=dirichlet`, `seed=1`); filters
    of one axis add up (`seed=0` and `seed=1` keep both), those of different axes narrow. The
    runs kept are runs of the full matrix, with the same keys."""
    if not filters:
        return data
    data = copy.deepcopy(data)
    matrix = data.get("matrix") if isinstance(data.get("matrix"), dict) else {}
    wanted_by_axis: dict[str, list[tuple[str, Any]]] = {}
    for text in filters:
        axis, has_value, raw = text.partition("=")
        axis = axis.strip()
        if not has_value or not axis:
            raise InputError(f"--only {text!r}: expected AXIS=VALUE, e.g. --only algorithm=fedprox")
        if axis not in matrix:
            axes = ", ".join(matrix) or "none (the spec has no matrix)"
            raise InputError(f"--only {text!r}: {axis} is no matrix axis; the axes: {axes}")
        wanted_by_axis.setdefault(axis, []).append((text, yaml.safe_load(raw)))
    for axis, wanted in wanted_by_axis.items():
        values = matrix[axis] if isinstance(matrix[axis], list) else [matrix[axis]]
        for text, one in wanted:
            if not any(_matches(value, one) for value in values):
                shown = ", ".join(_name(v) for v in values)
                raise InputError(
                    f"--only {text!r}: no value of matrix.{axis} matches; its values: {shown}"
                )
        matrix[axis] = [v for v in values if any(_matches(v, one) for _, one in wanted)]
    return data


def _matches(value: Any, wanted: Any) -> bool:
    """An axis value matches itself, a section its `name` or `scheme`, or a mapping of some of
    its fields (`{scheme: dirichlet, alpha: 0.1}`)."""
    if value == wanted or not isinstance(value, dict):
        return value == wanted
    if isinstance(wanted, dict):
        return all(value.get(field) == v for field, v in wanted.items())
    return wanted in (value.get("name"), value.get("scheme"))


def flow_yaml(value: Any) -> str:
    """A value as YAML on one line (a mapping in braces), as a command line writes it."""
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1000)
    return text.removesuffix("\n...\n").strip()


def _name(value: Any) -> str:
    if isinstance(value, dict) and ("name" in value or "scheme" in value):
        return str(value.get("name", value.get("scheme")))
    return flow_yaml(value)


def blame(source: str, overrides: Sequence[str], error_path: list[str]) -> str:
    """Who a validation error belongs to: the overrides sharing the longest leading part of the
    error's path, else the file (named with every override when the error has no path)."""
    if not error_path:
        return f"{source} with override{'s' if len(overrides) > 1 else ''} " + ", ".join(
            repr(o) for o in overrides
        )
    shared = {o: _common_prefix(override_path(o), error_path) for o in overrides}
    best = max(shared.values())
    if best == 0:
        return source
    return "override " + ", ".join(repr(o) for o, n in shared.items() if n == best)


def _common_prefix(a: list[str], b: list[str]) -> int:
    shared = itertools.takewhile(lambda pair: pair[0] == pair[1], zip(a, b, strict=False))
    return sum(1 for _ in shared)
