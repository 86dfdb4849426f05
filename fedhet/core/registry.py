"""Methods are plug-ins, found through the `fedhet.methods` entry-point group.

A package (fedhet itself included) registers a method by naming a `Method` object under that
group in its packaging metadata:

    [project.entry-points."fedhet.methods"]
    mymethod = "my_package:METHOD"

Importing the method's module registers its stages (`fedhet.core.pipeline.stage`). A plug-in
that cannot be loaded (import error, duplicate name, invalid config class) is skipped and
described in one line by `problems()`; every other method keeps working.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Protocol

from pydantic import create_model

from fedhet.core.errors import InputError
from fedhet.core.sections import AlgorithmSpec, Section

GROUP = "fedhet.methods"


class AlgorithmClass(Protocol):
    """What the registry needs of an algorithm class (the engine's `Algorithm` has it all)."""

    name: str
    Config: type[AlgorithmSpec]
    accepts_objectives: bool


class ObjectiveWrapper(Protocol):
    """A method that replaces the data term of any algorithm's local objective (VHL): its config
    becomes an optional field (`field`) of every algorithm that `accepts_objectives`."""

    field: str
    Config: type[Section]


@dataclass(frozen=True)
class Method:
    name: str
    algorithms: tuple[Any, ...] = ()  # AlgorithmClass
    objectives: tuple[Any, ...] = ()  # ObjectiveWrapper


@dataclass
class _Registry:
    methods: dict[str, Method]
    algorithms: dict[str, Any]
    objectives: dict[str, Any]
    problems: list[str]


def _package(entry: EntryPoint) -> str:
    dist = getattr(entry, "dist", None)
    return dist.name if dist is not None else entry.value.split(":")[0]


def _check_algorithm(algo: Any) -> str | None:
    config = getattr(algo, "Config", None)
    if not (isinstance(config, type) and issubclass(config, AlgorithmSpec)):
        return f"algorithm {getattr(algo, 'name', algo)!r}: Config is not an AlgorithmSpec"
    default = config.model_fields["name"].default
    if default != algo.name:
        return f"algorithm {algo.name!r}: Config's name defaults to {default!r}"
    return None


def _with_objectives(algo: Any, objectives: dict[str, Any]) -> Any:
    """The algorithm with each objective wrapper's config as an optional field of its Config."""
    if not objectives or not getattr(algo, "accepts_objectives", False):
        return algo
    fields = {field: (wrapper.Config | None, None) for field, wrapper in objectives.items()}
    config = create_model(
        algo.Config.__name__, __base__=algo.Config, __module__=algo.Config.__module__, **fields
    )
    config.objective_fields = tuple(objectives)
    return type(algo.__name__, (algo,), {"Config": config, "__module__": algo.__module__})


@cache
def _load() -> _Registry:
    reg = _Registry({}, {}, {}, [])
    raw_algorithms: dict[str, Any] = {}
    for entry in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        where = f"plugin {_package(entry)!r} ({entry.name} = {entry.value})"
        try:
            method = entry.load()
        except Exception as err:  # whatever a broken plug-in raises, the others keep working
            reg.problems.append(f"{where}: cannot be loaded: {type(err).__name__}: {err}")
            continue
        if not isinstance(method, Method):
            reg.problems.append(f"{where}: is not a fedhet.core.registry.Method")
            continue
        if method.name in reg.methods:
            reg.problems.append(f"{where}: duplicate method name {method.name!r}; skipped")
            continue
        problems = [p for p in map(_check_algorithm, method.algorithms) if p]
        clashes = [a.name for a in method.algorithms if a.name in raw_algorithms]
        problems += [f"duplicate algorithm name {name!r}" for name in clashes]
        if problems:
            reg.problems.append(f"{where}: {'; '.join(problems)}; skipped")
            continue
        reg.methods[method.name] = method
        raw_algorithms.update({a.name: a for a in method.algorithms})
        reg.objectives.update({w.field: w for w in method.objectives})
    reg.algorithms = {n: _with_objectives(a, reg.objectives) for n, a in raw_algorithms.items()}
    return reg


def methods() -> dict[str, Method]:
    return _load().methods


def algorithms() -> dict[str, Any]:
    """Algorithm name -> class (objective wrappers already composed into its Config)."""
    return _load().algorithms


def algorithm(name: str) -> Any:
    found = algorithms().get(name)
    if found is None:
        raise InputError(
            f"algorithm.name: unknown algorithm {name!r}; choose one of {', '.join(algorithms())}"
        )
    return found


def objectives() -> dict[str, Any]:
    """Config field -> objective wrapper."""
    return _load().objectives


def problems() -> list[str]:
    """One line per plug-in that could not be loaded."""
    return _load().problems
