"""A spec's runs: one per combination of its `matrix` axes' values, each its own spec."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable
from typing import Any

from fedhet.core.errors import InputError
from fedhet.core.spec.overrides import flow_yaml
from fedhet.core.spec.root import Spec
from fedhet.core.spec.wording import validated


def parse_run(data: Any, source: str) -> Spec:
    """A mapping validated into the spec of one run of a spec validated whole (a matrix run,
    TCT's stage 1), whose fields may apply only to other runs of the spec; InputError with a
    one-line message when it is invalid."""
    return validated(data, source)


def expand(spec: Spec) -> list[tuple[dict[str, Any], Spec]]:
    """One (axis values, run spec) pair per matrix combination; a spec without matrix is one run."""
    if not spec.matrix:
        return [({}, spec)]
    base = spec.model_dump(mode="json", exclude={"matrix"}, serialize_as_any=True)
    axes = list(spec.matrix)
    runs = []
    for values in itertools.product(*(spec.matrix[a] for a in axes)):
        data = with_axes(base, zip(axes, values, strict=True))
        axis_values = dict(zip(axes, values, strict=True))
        runs.append((axis_values, parse_run(data, f"matrix run {_run_name(axis_values)}")))
    return runs


def _run_name(axis_values: dict[str, Any]) -> str:
    """A matrix run by its axes' values as a spec writes them: `algorithm.name=fedprox, seed=1`."""
    return ", ".join(f"{axis}={flow_yaml(value)}" for axis, value in axis_values.items())


def with_axes(base: dict[str, Any], axis_values: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """A copy of a spec's mapping with each matrix axis set to its value."""
    data = copy.deepcopy(base)
    for axis, value in sorted(axis_values, key=_application_order):
        if axis == "algorithm.name":  # a new algorithm starts from its own defaults
            data["algorithm"] = {"name": value}
        else:
            _set_path(data, axis, value)
    return data


def _application_order(axis_value: tuple[str, Any]) -> tuple[bool, int]:
    """Whole sections before the fields inside them, so e.g. `algorithm.name` and `algorithm.mu`
    axes combine whatever their order in the file."""
    axis = axis_value[0]
    return axis != "algorithm.name", axis.count(".")


def _set_path(data: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise InputError(f"matrix: {dotted}: {part} is not a section")
    node[leaf] = copy.deepcopy(value)
