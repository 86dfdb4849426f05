"""The `algorithm:` section, validated by the config class of the algorithm it names
(fedhet.core.registry: every method declares its own)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from fedhet.core import registry
from fedhet.core.sections import AlgorithmSpec
from fedhet.core.spec.located import located_error


def algorithm_configs() -> dict[str, type[AlgorithmSpec]]:
    """name -> config class of every registered algorithm (the plug-ins are loaded lazily)."""
    return registry.configs()


def _not_an_algorithm(name: Any, configs: dict[str, type[AlgorithmSpec]]) -> str:
    unloaded = registry.unloaded(name)  # a method plug-in of that name that failed to load
    if unloaded:
        return unloaded
    if name in registry.objective_fields():  # a wrapper goes on a base algorithm
        bases = [n for n, config in configs.items() if name in config.model_fields]
        base = "fedavg" if "fedavg" in bases else bases[0]
        return (
            f"{name} is an objective wrapper, not an algorithm; put it on a base algorithm "
            f"({', '.join(sorted(bases))}): algorithm: {{name: {base}, {name}: {{}}}}"
        )
    return f"unknown or missing algorithm; choose one of {', '.join(sorted(configs))}"


def validate_algorithm(value: Any) -> AlgorithmSpec:
    """The algorithm's own config class validates the block; errors are placed under `algorithm`."""
    if isinstance(value, AlgorithmSpec):
        return value
    if not isinstance(value, dict):
        raise located_error(("algorithm",), "must be a mapping, e.g. {name: fedavg}", value)
    configs = algorithm_configs()
    name = value.get("name")
    if not isinstance(name, str) or name not in configs:
        raise located_error(("algorithm", "name"), _not_an_algorithm(name, configs), name)
    try:
        return registry.validated(name, value)
    except ValidationError as err:
        located = [
            {"type": e["type"], "loc": ("algorithm", *e["loc"]), "input": e["input"]}
            | ({"ctx": e["ctx"]} if "ctx" in e else {})
            for e in err.errors()
        ]
        raise ValidationError.from_exception_data("Spec", located) from None
