"""FedImpro's local objective (Eq. 6 in the form of Theorem 4.2) and its parameter split.

The high-level part sees the N real and the N_hat sampled features as one mixture, each
sample weighted alike (the theorem's p_hat weights); the low-level part, which only real
data reach, keeps the gradient of the plain cross-entropy on the real batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.methods.fedimpro.statistics import sample_features


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by `scale`."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


def decoupled_loss(
    high: nn.Module,
    real_features: torch.Tensor,
    labels: torch.Tensor,
    sampled_features: torch.Tensor,
    sampled_labels: torch.Tensor,
    real_share: float,
) -> torch.Tensor:
    """real_share * CE(high(h), y) + (1 - real_share) * CE(high(h_hat), y_hat).

    The gradient reaching `real_features` (hence the low-level part) is rescaled to that of
    CE(high(h), y) alone; `sampled_features` are detached, so they never reach it.
    """
    n = len(labels)
    real = _ScaleGrad.apply(real_features, 1.0 / real_share)
    logits = high(torch.cat([real, sampled_features.detach()]))
    losses = F.cross_entropy(logits, torch.cat([labels, sampled_labels]), reduction="none")
    return real_share * losses[:n].mean() + (1 - real_share) * losses[n:].mean()


def sampled_feature_loss(
    high: nn.Module,
    features: torch.Tensor,
    labels: torch.Tensor,
    mean: torch.Tensor,
    var: torch.Tensor,
    count: int,
    weight: float,
    generator: torch.Generator,
    std_clip: float | None = None,
) -> torch.Tensor:
    """Eq. 6 for one batch: `count` class-balanced features drawn from N(mean, var), each
    weighted `weight` times a real sample, mixed with the batch's real `features`."""
    sampled, sampled_labels = sample_features(mean, var, count, generator, std_clip)
    sampled = sampled.to(features).view(count, *features.shape[1:])
    share = len(labels) / (len(labels) + weight * count)
    return decoupled_loss(high, features, labels, sampled, sampled_labels, share)


def parameter_groups(model: nn.Module, split: str) -> dict[str, list[str]]:
    """{'low': names of the low-level parameters, 'high': the rest} for a split point."""
    low, _ = model.split(split)
    low_ids = {id(p) for p in low.parameters()}
    groups: dict[str, list[str]] = {"low": [], "high": []}
    for name, p in model.named_parameters():
        groups["low" if id(p) in low_ids else "high"].append(name)
    return groups
