"""What `fedhet eval` reports of one model: test accuracy and loss, per class and per client."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Scores:
    """A model's test accuracy and loss, its test accuracy on each class, its accuracy on each
    client's training samples, and with per-client test sets (fedhet.data.client_test) each
    client's accuracy on its own test set (None without them, or for a method that does not
    measure it). With a rotation feature shift, `own_angle` is the test accuracy when every test
    image is shown at its class's own training angle (fedhet.engine.setup.own_angle_test): a
    model that learned orientation as the label scores high there and low on the test set.
    `global_accuracy` is the test accuracy of the method's global model (`accuracy` itself for a
    method that evaluates its global model alone; for a personalized one, `accuracy` is the mean
    over the clients' own models), None for a method without one (FedPer, FedBN, Local)."""

    accuracy: float
    loss: float
    per_class: list[float]
    per_client: list[float]
    client_test: list[float] | None = None
    own_angle: float | None = None
    global_accuracy: float | None = None


@dataclass(frozen=True)
class ClientSpread:
    """How accuracy spreads over clients (clients with no test samples left out): the mean, the
    mean weighted by the clients' `weights` (their training samples; without weights, the
    mean), the mean of the worst decile (the ceil(K / 10) lowest of the K clients measured) and
    the standard deviation (np.std, ddof=0); NaN when no client is measured."""

    mean: float
    weighted_mean: float
    worst_decile: float
    std: float


def client_spread(
    accuracies: Sequence[float], weights: Sequence[float] | None = None
) -> ClientSpread:
    values = np.asarray(accuracies, dtype=np.float64)
    measured = ~np.isnan(values)
    if not measured.any():
        return ClientSpread(math.nan, math.nan, math.nan, math.nan)
    weighted = np.ones_like(values) if weights is None else np.asarray(weights, dtype=np.float64)
    ranked = np.sort(values[measured])
    worst = ranked[: math.ceil(ranked.size / 10)]
    return ClientSpread(
        float(ranked.mean()),
        float(np.average(values[measured], weights=weighted[measured])),
        float(worst.mean()),
        float(ranked.std()),
    )


def class_accuracies(
    predicted: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> list[float]:
    """Accuracy on the samples of each class; NaN for a class without samples."""
    return [
        float((predicted[labels == c] == c).float().mean()) if (labels == c).any() else float("nan")
        for c in range(num_classes)
    ]
