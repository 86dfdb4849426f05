"""Datasets and models are plug-ins, found through the `fedhet.datasets` and `fedhet.models`
entry-point groups, as methods are through `fedhet.methods` (fedhet.core.registry). fedhet's own
datasets are registered there too (its `pyproject.toml`) and load first, so their names stay
theirs.

A package registers one by naming its config class in its packaging metadata:

    [project.entry-points."fedhet.datasets"]
    mydata = "my_package.plugin:MyDataConfig"     # a fedhet.core.data_config.DataConfig
    [project.entry-points."fedhet.models"]
    mynet = "my_package.plugin:MyNetConfig"       # a fedhet.core.model_config.ModelConfig

The module holding the class stays light (no torch): validating and planning import only it;
the code that loads the data or builds the network is imported on first use. A plug-in that
fails in any way as it is loaded or registered (it raises on import, exits, names no config
class, reuses a name) is skipped with one warning naming it and its distribution
(fedhet.core.plugin_isolation); the others keep working, and a spec naming it is refused in one
line saying why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

from fedhet.core.model_config import ModelConfig
from fedhet.core.plugin_isolation import Plugin, answer, load_all, load_order
from fedhet.core.sections import Section

DATASETS, MODELS = "fedhet.datasets", "fedhet.models"


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


@dataclass
class _Loaded:
    """What loading a group's entry points gave beside its configs."""

    plugins: dict[str, Plugin] = field(default_factory=dict)  # name -> the plug-in adding it
    failures: dict[str, str] = field(default_factory=dict)  # entry point name -> its failure


_loaded: dict[str, _Loaded] = {}  # group -> what its latest `found` loaded


@cache
def found(group: str, builtin: tuple[str, ...]) -> dict[str, type[Section]]:
    """Name -> config class of every loadable plug-in of `group`, none named as one of fedhet's
    `builtin` ones; a problem is logged once per process (the CLI prints `warning: ...`)."""
    tag, problem_of = _GROUPS[group]
    configs: dict[str, type[Section]] = {}
    loaded = _loaded[group] = _Loaded()

    def register(plugin: Plugin, config: Any) -> str | None:
        problem = problem_of(config)
        name = None if problem else config.model_fields[tag].default
        if problem is None and not isinstance(name, str):
            problem = f"its {tag} has no name for a default"
        elif problem is None and name in (*builtin, *configs):
            problem = f"{tag} {name!r} is taken (by fedhet or another plug-in)"
        if problem is None:
            configs[name], loaded.plugins[name] = config, plugin
        return problem

    load_all(sorted(entry_points(group=group), key=load_order), register, loaded.failures)
    return configs


def validate_section(
    value: Any, section: str, tag: str, configs: dict[str, type[BaseModel]], default: str
) -> Any:
    """The spec's `section` block validated by the config class that its `tag` (default
    `default`) chooses among `configs`, errors located under `section`; a value that is not a
    mapping is left for pydantic to refuse. What a plug-in's code raises besides a validation
    error (a validator, or a dataset's `describe()`, that fails) is an error of the block naming
    the plug-in; a name whose plug-in failed to load is refused with the reason."""
    if not isinstance(value, dict):
        return value
    name = value.get(tag, default)
    group = next(g for g, (t, _) in _GROUPS.items() if t == tag)
    loaded = _loaded.get(group, _Loaded())  # of the `found` that gave `configs`
    if not isinstance(name, str) or name not in configs:
        choices = ", ".join(sorted(configs))
        unloaded = loaded.failures.get(name) if isinstance(name, str) else None  # it failed
        message = unloaded or f"unknown value; choose one of {choices}"
        raise _error([{"type": "spec", "loc": (tag,), "msg": message, "input": name}], section)
    plugins = [p for p in [loaded.plugins.get(name)] if p is not None and not p.builtin]
    try:
        config = answer(
            plugins, "its validation failed", value, configs[name].model_validate, value
        )
        if tag == "dataset" and plugins:  # validating and planning ask for the description
            answer(plugins, "its describe() failed", value, config.describe)
    except ValidationError as err:
        raise _error(err.errors(), section) from None
    return config


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
