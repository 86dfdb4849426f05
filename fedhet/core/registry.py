"""Methods are plug-ins, found through the `fedhet.methods` entry-point group.

A package (fedhet itself included) registers a method by naming a `Method` object under that
group in its packaging metadata:

    [project.entry-points."fedhet.methods"]
    mymethod = "my_package.plugin:METHOD"

The module holding METHOD should be light (no torch): it names each algorithm by its spec block,
a config class (`fedhet.engine.description.MethodConfig`) that plans the algorithm's runs and
names the import path of its trainer, so validating and planning never import a method's
training code. A trainer, an objective wrapper and the modules registering a method's stages
(`fedhet.core.pipeline.stage`) are imported on first use.

A plug-in that cannot be loaded (import error, duplicate name, invalid config class) is skipped
and described in one line by `problems()`; every other method keeps working.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import cache
from importlib import import_module
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Protocol

from pydantic import create_model

from fedhet.core.errors import RunError
from fedhet.core.sections import AlgorithmSpec, Section

GROUP = "fedhet.methods"
log = logging.getLogger(__name__)


class ObjectiveWrapper(Protocol):
    """A method that replaces the data term of any algorithm's local objective (VHL): its config
    (which plans what the objective adds to a run) becomes an optional field (`field`) of every
    algorithm whose config `accepts_objectives`; `build` makes the run's objective."""

    field: str
    Config: type[Section]

    def build(self, config: Any, setup: Any, feature_dim: int) -> Any: ...


def _resolve(target: str | Any) -> Any:
    """What a "package.module:attribute" or "package.module" path names (an object as is)."""
    if not isinstance(target, str):
        return target
    module, _, attribute = target.partition(":")
    imported = import_module(module)
    return getattr(imported, attribute) if attribute else imported


@dataclass(frozen=True)
class ObjectiveEntry:
    """An objective wrapper as a plug-in declares it: its field, config, and class or path."""

    field: str
    config: type[Section]
    implementation: str | Any


@dataclass(frozen=True)
class Method:
    name: str
    configs: tuple[type[AlgorithmSpec], ...] = ()  # one MethodConfig subclass per algorithm
    objectives: tuple[ObjectiveEntry | Any, ...] = ()  # ObjectiveEntry objects or wrapper classes
    stages: tuple[str, ...] = ()  # modules that register the method's stages when imported
    # "package.module:attribute" of a typer.Typer whose commands join fedhet's command line; its
    # module is imported on every command, so it stays light (the method's code imported inside)
    commands: tuple[str, ...] = ()


def _objective_entry(wrapper: Any) -> ObjectiveEntry:
    if isinstance(wrapper, ObjectiveEntry):
        return wrapper
    return ObjectiveEntry(wrapper.field, wrapper.Config, wrapper)


@dataclass
class _Registry:
    methods: dict[str, Method] = field(default_factory=dict)
    algorithms: dict[str, type[AlgorithmSpec]] = field(default_factory=dict)  # as declared
    configs: dict[str, type[AlgorithmSpec]] = field(default_factory=dict)
    objectives: dict[str, ObjectiveEntry] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)  # objective field -> plug-in
    problems: list[str] = field(default_factory=list)


def _package(entry: EntryPoint) -> str:
    dist = getattr(entry, "dist", None)
    return dist.name if dist is not None else entry.value.split(":")[0]


def _name(config: type[AlgorithmSpec]) -> Any:
    return config.model_fields["name"].default


def _check_config(config: Any) -> str | None:
    # a MethodConfig (fedhet.engine.description, a layer above this one) is known by what it does
    if not (
        isinstance(config, type)
        and issubclass(config, AlgorithmSpec)
        and callable(getattr(config, "trainer_class", None))
    ):
        return f"config {config!r} is not a MethodConfig"
    if not isinstance(_name(config), str) or not _name(config):
        return f"config {config.__name__}: its name has no default"
    return None


def _with_objectives(config: type[AlgorithmSpec], objectives: dict[str, ObjectiveEntry]) -> type:
    """`config` with each objective wrapper's config as an optional field."""
    if not objectives or not config.accepts_objectives:
        return config
    fields = {name: (wrapper.config | None, None) for name, wrapper in objectives.items()}
    composed = create_model(
        config.__name__, __base__=config, __module__=config.__module__, **fields
    )
    composed.objective_fields = tuple(objectives)
    return composed


def _add(reg: _Registry, method: Method, where: str) -> None:
    if method.name in reg.methods:
        reg.problems.append(f"{where}: duplicate method name {method.name!r}; skipped")
        return
    try:
        wrappers = [_objective_entry(w) for w in method.objectives]
    except AttributeError as err:
        reg.problems.append(f"{where}: {err}; skipped")
        return
    problems = [p for p in map(_check_config, method.configs) if p]
    if not problems:  # a config's name exists once it is checked
        names = map(_name, method.configs)
        problems = [f"duplicate algorithm name {n!r}" for n in names if n in reg.algorithms]
    if problems:
        reg.problems.append(f"{where}: {'; '.join(problems)}; skipped")
        return
    reg.methods[method.name] = method
    for config in method.configs:
        reg.algorithms[_name(config)] = config
    for wrapper in wrappers:
        reg.objectives[wrapper.field] = wrapper
        reg.owners[wrapper.field] = where


@cache
def _load() -> _Registry:
    reg = _Registry()
    for entry in sorted(entry_points(group=GROUP), key=_load_order):
        where = f"plugin {_package(entry)!r} ({entry.name} = {entry.value})"
        try:
            method = entry.load()
        except Exception as err:  # whatever a broken plug-in raises, the others keep working
            why = " ".join(str(err).split())
            reg.problems.append(f"{where}: cannot be loaded: {type(err).__name__}: {why}")
            continue
        if not isinstance(method, Method):
            reg.problems.append(f"{where}: is not a fedhet.core.registry.Method")
            continue
        _add(reg, method, where)
    reg.configs = {
        name: _with_objectives(config, reg.objectives) for name, config in reg.algorithms.items()
    }
    for problem in reg.problems:  # once per process; the CLI prints them as `warning: ...`
        log.warning(problem)
    return reg


def _load_order(entry: EntryPoint) -> tuple[bool, str, str]:
    """fedhet's own methods first, so a plug-in reusing one of their names is the one skipped."""
    package = _package(entry)
    return package != "fedhet", package, entry.name


def _import(target: str | Any, owner: str) -> Any:
    try:
        return _resolve(target)
    except Exception as err:  # a plug-in's code failing to import is the plug-in's failure
        raise RunError(f"{owner}: cannot import {target}: {type(err).__name__}: {err}") from err


def methods() -> dict[str, Method]:
    return _load().methods


def configs() -> dict[str, type[AlgorithmSpec]]:
    """Algorithm name -> its config class, a MethodConfig (objective wrappers composed in, as a
    subclass of the declared one); imports no training code."""
    return _load().configs


def objective_fields() -> tuple[str, ...]:
    """The config fields of the objective wrappers (`vhl`); imports no wrapper."""
    return tuple(_load().objectives)


@cache
def objectives() -> dict[str, Any]:
    """Config field -> objective wrapper (imported on first use)."""
    reg = _load()
    return {f: _import(w.implementation, reg.owners[f]) for f, w in reg.objectives.items()}


@cache
def load_stages() -> None:
    """Import every method's stage modules, so that their stages are registered."""
    for method in methods().values():
        for module in method.stages:
            _import(module, f"method {method.name!r}")


@cache
def commands() -> list[Any]:
    """The typer.Typer objects that methods' `commands` name; one that cannot be imported is
    skipped with a warning (every other command keeps working)."""
    found = []
    for method in methods().values():
        for path in method.commands:
            try:
                found.append(_resolve(path))
            except Exception as err:  # whatever a broken plug-in raises
                log.warning(f"method {method.name!r}: cannot import {path}: {err}; skipped")
    return found


def problems() -> list[str]:
    """One line per plug-in that could not be loaded."""
    return _load().problems
