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

A plug-in that fails in any way as it is loaded or registered (it raises on import, exits, names
something that is not a Method, reuses a name) is skipped with one warning naming it and its
distribution (fedhet.core.plugin_isolation), and described by `problems()`; every other method
keeps working, and a spec naming its algorithm is refused in one line saying why. A method whose
stages or commands cannot be imported loses those alone, with one warning.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache, partial
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any, Protocol

from pydantic import create_model

from fedhet.core.errors import FedhetError
from fedhet.core.plugin_isolation import (
    Plugin,
    PluginError,
    answer,
    attempt,
    load_all,
    load_order,
    warn,
)
from fedhet.core.sections import AlgorithmSpec, Section

GROUP = "fedhet.methods"


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
    # the plug-in of each method, algorithm and objective field
    method_plugins: dict[str, Plugin] = field(default_factory=dict)
    algorithm_plugins: dict[str, Plugin] = field(default_factory=dict)
    objective_plugins: dict[str, Plugin] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)  # entry point name -> its failure
    stage_failures: list[str] = field(default_factory=list)


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


def _check_objective(wrapper: ObjectiveEntry) -> str | None:
    if not (isinstance(wrapper.config, type) and issubclass(wrapper.config, Section)):
        return f"objective config {wrapper.config!r} is not an ObjectiveConfig"
    if not isinstance(wrapper.field, str) or not wrapper.field.isidentifier():
        return f"objective field {wrapper.field!r} is not a name"
    _with_objectives(AlgorithmSpec, {wrapper.field: wrapper}, always=True)  # raises if it cannot
    return None


def _with_objectives(
    config: type[AlgorithmSpec], objectives: dict[str, ObjectiveEntry], always: bool = False
) -> type:
    """`config` with each objective wrapper's config as an optional field (if it accepts
    objectives, or `always`)."""
    if not objectives or not (always or config.accepts_objectives):
        return config
    fields = {name: (wrapper.config | None, None) for name, wrapper in objectives.items()}
    composed = create_model(
        config.__name__, __base__=config, __module__=config.__module__, **fields
    )
    composed.objective_fields = tuple(objectives)
    return composed


def _method_problem(method: Any) -> str | None:
    """What makes `method` (what an entry point names) unfit to register, beside its configs."""
    if not isinstance(method, Method):
        return "is not a fedhet.core.registry.Method"
    if not isinstance(method.name, str) or not method.name:
        return f"method name {method.name!r} is not a name"
    for part in ("configs", "objectives", "stages", "commands"):
        if not isinstance(getattr(method, part), tuple | list):
            return f"method {method.name!r}: its {part} is not a tuple"
    if not all(isinstance(path, str) for path in (*method.stages, *method.commands)):
        return f"method {method.name!r}: its stages and commands are not module paths"
    return None


def _add(reg: _Registry, plugin: Plugin, method: Any) -> str | None:
    """Register `method` from `plugin`; or the problem that keeps it out."""
    problem = _method_problem(method)
    if problem:
        return problem
    if method.name in reg.methods:
        return f"duplicate method name {method.name!r}"
    wrappers = [_objective_entry(w) for w in method.objectives]
    problems = [p for p in map(_check_config, method.configs) if p]
    problems += [p for p in map(_check_objective, wrappers) if p]
    if not problems:  # a config's name exists once it is checked
        names = map(_name, method.configs)
        problems = [f"duplicate algorithm name {n!r}" for n in names if n in reg.algorithms]
        fields = [w.field for w in wrappers]
        problems += [f"duplicate objective field {f!r}" for f in fields if f in reg.objectives]
    if problems:
        return "; ".join(problems)
    reg.methods[method.name] = method
    reg.method_plugins[method.name] = plugin
    for config in method.configs:
        reg.algorithms[_name(config)] = config
        reg.algorithm_plugins[_name(config)] = plugin
    for wrapper in wrappers:
        reg.objectives[wrapper.field] = wrapper
        reg.objective_plugins[wrapper.field] = plugin
    return None


@cache
def _load() -> _Registry:
    """Every method plug-in that loads; each that does not is one warning (once per process;
    the CLI prints it as `warning: ...`) and is recorded in `failures`."""
    reg = _Registry()
    entries = sorted(entry_points(group=GROUP), key=load_order)
    load_all(entries, partial(_add, reg), reg.failures)
    reg.configs = {
        name: _with_objectives(config, reg.objectives) for name, config in reg.algorithms.items()
    }
    return reg


def methods() -> dict[str, Method]:
    return _load().methods


def configs() -> dict[str, type[AlgorithmSpec]]:
    """Algorithm name -> its config class, a MethodConfig (objective wrappers composed in, as a
    subclass of the declared one); imports no training code."""
    return _load().configs


def validated(name: str, value: dict[str, Any]) -> AlgorithmSpec:
    """The config of algorithm `name` validated from `value` (its spec block); what a plug-in's
    code raises besides a validation error (a validator that fails) is a validation error of the
    block naming the plug-in."""
    reg = _load()
    owners = [reg.algorithm_plugins[name]]
    owners += [plugin for f, plugin in reg.objective_plugins.items() if f in value]
    plugins = [plugin for plugin in owners if not plugin.builtin]  # fedhet's own: a bug shows
    return answer(plugins, "its validation failed", value, reg.configs[name].model_validate, value)


def checked(config: AlgorithmSpec, spec: Any) -> None:
    """`config.check(spec)`; what a plug-in's check raises besides fedhet's own errors (a bug
    of its own) is an InputError naming the plug-in."""
    reg = _load()
    owners = [reg.algorithm_plugins.get(config.name)]
    owners += [p for f, p in reg.objective_plugins.items() if getattr(config, f, None) is not None]
    plugins = [plugin for plugin in owners if plugin is not None and not plugin.builtin]
    attempt(plugins, "its check() failed", config.check, spec, answers=(FedhetError,))


def unloaded(name: Any) -> str | None:
    """Why the algorithm `name` is unknown, if a method plug-in of that name failed to load."""
    return _load().failures.get(name) if isinstance(name, str) else None


def objective_fields() -> tuple[str, ...]:
    """The config fields of the objective wrappers (`vhl`); imports no wrapper."""
    return tuple(_load().objectives)


@cache
def objective(field: str) -> Any:
    """The objective wrapper of config field `field` (imported on first use)."""
    reg = _load()
    plugin, target = reg.objective_plugins[field], reg.objectives[field].implementation
    return attempt([plugin], f"cannot import {target}", _resolve, target)


@cache
def load_stages() -> None:
    """Import every method's stage modules, so that their stages are registered; a method whose
    stages cannot be imported is one warning and recorded in `stage_problems()`."""
    reg = _load()
    for method in reg.methods.values():
        plugin = reg.method_plugins[method.name]
        try:
            for module in method.stages:
                attempt([plugin], f"cannot import its stages {module}", import_module, module)
        except PluginError as failure:
            reg.stage_failures.append(str(failure))
            warn(failure, "its stages skipped")


def stage_problems() -> list[str]:
    """One line per method whose stage modules could not be imported."""
    return _load().stage_failures


@cache
def commands() -> list[Any]:
    """The typer.Typer objects that methods' `commands` name; one that cannot be imported is
    skipped with a warning (every other command keeps working)."""
    reg, found = _load(), []
    for method in reg.methods.values():
        for path in method.commands:
            plugin = reg.method_plugins[method.name]
            try:
                found.append(attempt([plugin], f"cannot import {path}", _typer, path))
            except PluginError as failure:
                warn(failure, "skipped")
    return found


def _typer(path: str) -> Any:
    commands = _resolve(path)
    if not isinstance(getattr(commands, "registered_commands", None), list):
        raise TypeError(f"{commands!r} is not a typer.Typer")
    return commands


def problems() -> list[str]:
    """One line per plug-in that could not be loaded."""
    return list(_load().failures.values())
