"""Composable local objectives: the data term of a client's loss, replaceable by a method.

By default the data term is the cross-entropy of the client's batch. A method such as VHL
registers an objective wrapper (`fedhet.core.registry.ObjectiveWrapper`) whose config (a
`fedhet.engine.description.ObjectiveConfig`) becomes an optional field of every method that
accepts objectives; when that field is set, its config plans the upstream stages and extra model
outputs, and the wrapper, imported here on first use, builds the run's objective and its one-off
broadcast. Method-specific terms (FedProx's proximal term, SCAFFOLD's correction) apply on top.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.core import registry
from fedhet.core.sections import AlgorithmSpec

if TYPE_CHECKING:
    from fedhet.engine.setup import TrainSetup


class LocalObjective(Protocol):
    def loss(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor: ...

    def broadcast(self) -> dict[str, torch.Tensor]:
        """What the server sends every client once, before training starts."""
        ...


class CrossEntropy:
    def loss(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        return F.cross_entropy(model(x), y)

    def broadcast(self) -> dict[str, torch.Tensor]:
        return {}


def active(config: AlgorithmSpec) -> list[tuple[Any, Any]]:
    """(wrapper, its config) for every objective wrapper turned on in an algorithm config."""
    return [
        (registry.objective(field), getattr(config, field))
        for field in config.objective_fields
        if getattr(config, field) is not None
    ]


def build(
    config: AlgorithmSpec, setup: TrainSetup, feature_dim: Callable[[], int]
) -> LocalObjective:
    """The run's objective; `feature_dim` (the model's penultimate width) is asked only when
    a wrapper is on (at most one: `MethodConfig.check`)."""
    found = active(config)
    if not found:
        return CrossEntropy()
    wrapper, wrapper_config = found[0]
    return wrapper.build(wrapper_config, setup, feature_dim())
