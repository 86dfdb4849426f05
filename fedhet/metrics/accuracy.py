"""What `fedhet eval` reports of one model: test accuracy and loss, per class and per client."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Scores:
    """A model's test accuracy and loss, its test accuracy on each class, and its accuracy on
    each client's training samples."""

    accuracy: float
    loss: float
    per_class: list[float]
    per_client: list[float]


def class_accuracies(
    predicted: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> list[float]:
    """Accuracy on the samples of each class; NaN for a class without samples."""
    return [
        float((predicted[labels == c] == c).float().mean()) if (labels == c).any() else float("nan")
        for c in range(num_classes)
    ]
