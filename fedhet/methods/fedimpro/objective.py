"""FedImpro's local objective (Eq. 6) in its two forms, and the model's parameter split.

Both forward the N real and the N_hat sampled features through the high-level part in one
batch (as the authors' code, so normalization layers see both) and detach the sampled ones,
so only real data reach the low-level part.

- `official` (the authors' experiments, schedule `gradual2half`): CE(real) + w CE(sampled),
  each cross-entropy a mean over its own samples.
- `mixture` (Theorem 4.2): the high-level part sees one mixture of the real and sampled
  features, each sample weighted alike (real share N / (N + w N_hat)); the gradient reaching
  the low-level part is rescaled to that of the plain cross-entropy on the real batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.methods.fedimpro.config import Objective
from fedhet.methods.fedimpro.statistics import sample_features
from fedhet.plugin import scale_gradient


def _real_and_sampled_losses(
    high: nn.Module,
    real_features: torch.Tensor,
    labels: torch.Tensor,
    sampled_features: torch.Tensor,
    sampled_labels: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(CE over the real rows, CE over the sampled rows) of one forward of both."""
    n = len(labels)
    logits = high(torch.cat([real_features, sampled_features.detach()]))
    losses = F.cross_entropy(logits, torch.cat([labels, sampled_labels]), reduction="none")
    return losses[:n].mean(), losses[n:].mean()


def official_loss(
    high: nn.Module,
    real_features: torch.Tensor,
    labels: torch.Tensor,
    sampled_features: torch.Tensor,
    sampled_labels: torch.Tensor,
    weight: float,
) -> torch.Tensor:
    """CE(high(h), y) + weight * CE(high(h_hat), y_hat)."""
    real, sampled = _real_and_sampled_losses(
        high, real_features, labels, sampled_features, sampled_labels
    )
    return real + weight * sampled


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
    CE(high(h), y) alone.
    """
    real = scale_gradient(real_features, 1.0 / real_share)
    real_loss, sampled_loss = _real_and_sampled_losses(
        high, real, labels, sampled_features, sampled_labels
    )
    return real_share * real_loss + (1 - real_share) * sampled_loss


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
    objective: Objective = "official",
) -> torch.Tensor:
    """Eq. 6 for one batch: `count` class-balanced features drawn from N(mean, var) (std
    capped at `std_clip`) with weight `weight`, with the batch's real `features`."""
    sampled, sampled_labels = sample_features(mean, var, count, generator, std_clip)
    sampled = sampled.to(features).view(count, *features.shape[1:])
    if objective == "official":
        return official_loss(high, features, labels, sampled, sampled_labels, weight)
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
