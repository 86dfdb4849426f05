"""Datasets and models are plug-ins, found through the `fedhet.datasets` and `fedhet.models`
entry-point groups, as methods are through `fedhet.methods` (fedhet.core.registry).

A package registers one by naming its config class in its packaging metadata:

    [project.entry-points."fedhet.datasets"]
    mydata = "my_package.plugin:MyDataConfig"     # a fedhet.core.data_config.DataConfig
    [project.entry-points."fedhet.models"]
    mynet = "my_package.plugin:MyNetConfig"       # a fedhet.core.model_config.ModelConfig

The module holding the class stays light (no torch): validating and planning import only it;
the code that loads the data or builds the network is imported on first use. A plug-in that
cannot be loaded, or reuses a name, is skipped with a one-line warning; the others keep working.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

from fedhet.core.model_config import ModelConfig
from fedhet.core.sections import Section

DATASETS, MODELS = "fedhet.datasets", "fedhet.models"
log = logging.getLogger(__name__)


def _dataset_problem(config: Any) -> str | None:
    # a DataConfig (fedhet.core.data_config, a module above the spec) is known by what it has
    if not (
        isinstance(config, type)
        and issubclass(config, Section)
        and callable(getattr(config, "input_format", None))
        and callable(getattr(config, "describe", None))
        and isinstance(getattr(config, "loader", None), str)
    ):
        return f"{config!r} is not a fedhet.core.data_config.DataConfig with a loader"
    return None


def _model_problem(config: Any) -> str | None:
    if not (
        isinstance(config, type)
        and issubclass(config, ModelConfig)
        and isinstance(config.builder, str)
    ):
        return f"{config!r} is not a fedhet.core.model_config.ModelConfig with a builder"
    return None


_GROUPS: dict[str, tuple[str, Callable[[Any], str | None]]] = {
    DATASETS: ("dataset", _dataset_problem),
    MODELS: ("arch", _model_problem),
}


@cache
def found(group: str, builtin: tuple[str, ...]) -> dict[str, type[Section]]:
    """Name -> config class of every loadable plug-in of `group`, none named as one of fedhet's
    `builtin` ones; a problem is logged once per process (the CLI prints `warning: ...`)."""
    tag, problem_of = _GROUPS[group]
    configs: dict[str, type[Section]] = {}
    for entry in sorted(entry_points(group=group), key=lambda e: e.name):
        dist = getattr(entry, "dist", None)
        package = dist.name if dist is not None else entry.value
        where = f"plugin {package!r} ({entry.name} = {entry.value})"
        try:
            config = entry.load()
        except Exception as err:  # whatever a broken plug-in raises, the others keep working
            log.warning(f"{where}: cannot be loaded: {type(err).__name__}: {err}")
            continue
        problem = problem_of(config)
        name = None if problem else config.model_fields[tag].default
        if problem is None and not isinstance(name, str):
            problem = f"its {tag} has no name for a default"
        elif problem is None and name in (*builtin, *configs):
            problem = f"{tag} {name!r} is taken (by fedhet or another plug-in)"
        if problem:
            log.warning(f"{where}: {problem}; skipped")
            continue
        configs[name] = config
    return configs


def validate_section(
    value: Any, section: str, tag: str, configs: dict[str, type[BaseModel]], default: str
) -> Any:
    """The spec's `section` block validated by the config class that its `tag` (default
    `default`) chooses among `configs`, errors located under `section`; a value that is not a
    mapping is left for pydantic to refuse."""
    if not isinstance(value, dict):
        return value
    name = value.get(tag, default)
    if not isinstance(name, str) or name not in configs:
        choices = ", ".join(sorted(configs))
        message = f"unknown value; choose one of {choices}"
        raise _error([{"type": "spec", "loc": (tag,), "msg": message, "input": name}], section)
    try:
        return configs[name].model_validate(value)
    except ValidationError as err:
        raise _error(err.errors(), section) from None


def _error(errors: list[Any], section: str) -> ValidationError:
    """The errors of a section's validation, located under `section` (their types kept)."""
    located = [
        {
            "type": PydanticCustomError(e["type"], e["msg"]),
            "loc": (section, *e["loc"]),
            "input": e["input"],
        }
        for e in errors
    ]
    return ValidationError.from_exception_data("Spec", located)
