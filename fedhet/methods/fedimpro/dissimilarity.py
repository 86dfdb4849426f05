"""Theorem 4.2 measured: client gradient variance of the plain and the FedImpro objective.

At a fixed model, the shared feature distribution is the per-class Gaussian of the clients'
split-layer features (what the server's statistics estimate). Each client's FedImpro
objective adds N_hat = ratio * N features drawn from it (independently per client). CGV is
split into the low-level and the high-level parameters: the theorem says the low part is
unchanged and the high part shrinks by N^2 / (N + N_hat)^2 = 1 / (1 + ratio)^2. The theorem
is about the `mixture` objective; the `official` one (CE(real) + CE(sampled)) adds the nearly
client-independent sampled-feature gradient to each client's, so it leaves the CGV about as is.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import nn

from fedhet.methods.fedimpro.objective import (
    Objective,
    parameter_groups,
    sampled_feature_loss,
)
from fedhet.methods.fedimpro.statistics import class_moments
from fedhet.plugin import ClientData, LossFn, client_gradient_variance


def sampled_objective(
    split: str,
    mean: torch.Tensor,
    var: torch.Tensor,
    ratio: float,
    generator: torch.Generator,
    std_clip: float | None = None,
    objective: Objective = "mixture",
) -> LossFn:
    """loss_fn(model, x, y): the FedImpro objective with round(ratio * len(y)) sampled features
    from N(mean, var) (fresh draws from `generator` at every call), weight 1."""

    def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        low, high = model.split(split)
        count = max(1, round(ratio * len(y)))
        return sampled_feature_loss(
            high, low(x), y, mean, var, count, 1.0, generator, std_clip, objective
        )

    return loss_fn


def _feature_batches(
    low: nn.Module, clients: Sequence[ClientData], batch_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for client in clients:
        for start in range(0, client.n, batch_size):
            yield low(client.x[start : start + batch_size]), client.y[start : start + batch_size]


def decoupled_cgv(
    model: nn.Module,
    clients: Sequence[ClientData],
    split: str,
    num_classes: int,
    weights: Sequence[float] | None = None,
    ratio: float = 1.0,
    seed: int = 0,
    batch_size: int = 1000,
    objective: Objective = "mixture",
) -> dict[str, float]:
    """CGV of the plain and the FedImpro objective at the model, each in total and split into
    'low' and 'high' parts, plus the theorem's predicted high-level factor."""
    low, _ = model.split(split)
    was_training = model.training
    model.eval()
    try:
        mean, var = class_moments(_feature_batches(low, clients, batch_size), num_classes)
    finally:
        model.train(was_training)
    groups = parameter_groups(model, split)
    generator = torch.Generator().manual_seed(seed)
    loss_fn = sampled_objective(split, mean, var, ratio, generator, objective=objective)
    plain = client_gradient_variance(model, clients, weights, groups=groups, batch_size=batch_size)
    fedimpro = client_gradient_variance(
        model, clients, weights, loss_fn=loss_fn, groups=groups, batch_size=batch_size
    )
    report = {f"plain_{k}": v for k, v in plain.items()}
    report.update({f"fedimpro_{k}": v for k, v in fedimpro.items()})
    report["theorem_high_factor"] = 1 / (1 + ratio) ** 2
    return report
