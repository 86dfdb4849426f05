"""A spec as `fedhet spec show` prints it: every default filled in, less the fields that do not
apply to the options chosen."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from fedhet.core.errors import InputError
from fedhet.core.spec.conditions import pruned
from fedhet.core.spec.matrix import parse_run, with_axes
from fedhet.core.spec.root import Spec


def applicable_dump(section: BaseModel) -> dict[str, Any]:
    """The section with defaults filled in, less the fields that do not apply to the options
    chosen (e.g. `channels` of an mlp); a field the spec sets explicitly is always kept."""
    data = pruned(
        section, section.model_dump(mode="json", exclude_none=True, serialize_as_any=True)
    )
    if isinstance(section, Spec) and section.matrix:
        data["matrix"] = _filled_matrix(section)
    return data


def _filled_matrix(spec: Spec) -> dict[str, list[Any]]:
    """The matrix with each section it sets whole shown as its runs get it: defaults filled in."""
    base = spec.model_dump(mode="json", exclude={"matrix"}, serialize_as_any=True)
    return {
        axis: [_filled_entry(base, axis, v) if isinstance(v, dict) else v for v in values]
        for axis, values in spec.matrix.items()
    }


def _filled_entry(base: dict[str, Any], axis: str, value: dict[str, Any]) -> Any:
    try:
        node: Any = parse_run(with_axes(base, [(axis, value)]), f"matrix {axis}")
    except InputError:  # valid only combined with another axis's value: shown as written
        return value
    for part in axis.split("."):
        node = getattr(node, part)
    return applicable_dump(node) if isinstance(node, BaseModel) else value
