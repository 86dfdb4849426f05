"""The JSON Schema of specs (`fedhet spec schema`), for editors' completion and checking."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Union

from pydantic import BaseModel, Field, create_model

from fedhet.core.spec.algorithm import algorithm_configs, validate_algorithm
from fedhet.core.spec.data import dataset_configs
from fedhet.core.spec.model import ModelSpec, model_configs
from fedhet.core.spec.root import Spec
from fedhet.core.spec.tagged import tagged_union, validate_data


def json_schema() -> dict[str, Any]:
    """JSON Schema of specs, with the algorithm block as the union of every algorithm's config."""
    configs = tuple(algorithm_configs().values())
    algorithm_union = Annotated[Union[configs], Field(discriminator="name")]  # noqa: UP007
    default = Field(default_factory=lambda: validate_algorithm({"name": "fedavg"}))
    data_union = Union[tuple(dict.fromkeys(dataset_configs().values()))]  # noqa: UP007
    model_union = Union[tuple(dict.fromkeys(model_configs().values()))]  # noqa: UP007
    schema_model = create_model(
        "Spec",
        __base__=Spec,
        algorithm=(algorithm_union, default),
        data=(data_union, validate_data({})),
        model=(model_union, ModelSpec()),
    )
    schema = schema_model.model_json_schema()
    axes = {name: {"type": "array", "minItems": 1, "items": items} for name, items in _axes(schema)}
    matrix = {"type": "object", "properties": axes, "additionalProperties": _ANY_AXIS}
    schema["properties"]["matrix"]["anyOf"] = [matrix, {"type": "null"}]
    schema["properties"]["base"] = {
        "type": "string",
        "description": "the spec file this one derives from (relative to it); this file's "
        "fields are merged over it",
    }
    return schema


_ANY_AXIS = {"type": "array", "minItems": 1, "items": {}}  # a deeper path, e.g. algorithm.mu


def _axes(schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(matrix axis, schema of one of its values): every field of the spec and of its sections
    (the fields of the algorithm and partition, which depend on their choice, all but the tag)."""
    sections = {n: f for n, f in schema["properties"].items() if n != "matrix"}
    for name, field in sections.items():
        yield name, _value_schema(field)
        section = schema["$defs"][field["$ref"].split("/")[-1]] if "$ref" in field else {}
        for sub, sub_field in section.get("properties", {}).items():
            yield f"{name}.{sub}", _value_schema(sub_field)
    for name in ("algorithm", "data", "model", "partition"):
        tag, choices = _choices(name)
        yield f"{name}.{tag}", {"enum": sorted(choices)}


def _choices(section: str) -> tuple[str, dict[str, type[BaseModel]]]:
    """(tag field, tag -> config class) of a section whose config class its tag chooses."""
    union = tagged_union(section)
    assert union is not None, f"{section} is no tagged section"
    tag, _, choices = union
    return tag, choices


def _value_schema(field: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in field.items() if k not in ("default", "title", "description")}
