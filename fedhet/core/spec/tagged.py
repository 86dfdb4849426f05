"""The spec's sections whose config class a tag field chooses: `partition` by its `scheme`,
`algorithm` by its `name`, `data` by its `dataset` and `model` by its `arch` (the last two
fedhet's own or a plug-in's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, get_args

from pydantic import BaseModel

from fedhet.core import plugins
from fedhet.core.spec.algorithm import algorithm_configs
from fedhet.core.spec.data import DEFAULT_DATASET, DataSpec, dataset_configs
from fedhet.core.spec.model import model_configs
from fedhet.core.spec.partition import PartitionConfig

DISCRIMINATORS = ("scheme",)  # the tag fields of the spec's discriminated unions

# section -> (the field that chooses its config class, the classes, that field's default)
PLUGGABLE: dict[str, tuple[str, Callable[[], dict[str, type[BaseModel]]], str]] = {
    "data": ("dataset", dataset_configs, DEFAULT_DATASET),
    "model": ("arch", model_configs, "simple_cnn"),
}


def tagged_union(section: str) -> tuple[str, str, dict[str, type[BaseModel]]] | None:
    """(tag field, what the tag names, tag -> config class) of a spec section whose fields
    depend on its tag."""
    if section == "partition":
        members = get_args(PartitionConfig)
        return "scheme", "scheme", {m.model_fields["scheme"].default: m for m in members}
    if section == "algorithm":
        return "name", "algorithm", dict(algorithm_configs())
    if section in PLUGGABLE:
        tag, configs, _ = PLUGGABLE[section]
        return tag, tag, configs()
    return None


def validate_data(value: Any) -> DataSpec:
    """A `data:` block validated by its dataset's config class (default: digits)."""
    tag, configs, default = PLUGGABLE["data"]
    return plugins.validate_section(value, "data", tag, configs(), default)
