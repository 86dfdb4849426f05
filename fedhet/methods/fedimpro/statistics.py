"""Per-class Gaussian statistics of split-layer features (FedImpro, Sections 4.2-4.3).

A statistic is a pair of `classes x dim` tensors: the per-class mean and the per-class
variance of the flattened features. Clients track them with a moving average (Eq. 7), the
server combines the clients' uploads (Eq. 8), and every client samples class-balanced
features from the global Gaussian or from its own running one. Eq. 7 averages the batch
*variance*, so the variance is what is stored, averaged and sent; the std is its square root.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch


def init_statistics(
    num_classes: int, dim: int, std: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Starting (mean, var): means uniform in [0, 1) per class and dimension, variance std^2.

    Classes no client has seen yet are sampled from these (as in the authors' code).
    """
    mean = torch.rand(num_classes, dim, generator=generator)
    return mean, torch.full((num_classes, dim), std**2)


@torch.no_grad()
def update_statistics(
    mean: torch.Tensor,
    var: torch.Tensor,
    features: torch.Tensor,
    labels: torch.Tensor,
    momentum: float,
    rate_samples: int | None = None,
) -> None:
    """Eq. 7 in place, for each class present in the batch.

    stat_c <- stat_c + r_c * (batch stat of class c - stat_c) for the mean and the unbiased
    variance (the variance skipped for a class with a single sample in the batch), with
    r_c = 1 - momentum, or min(1, n_c / rate_samples) for n_c samples of class c in the batch
    (the authors' code, where the statistics move by the batch's share of a class's data).
    """
    count, total, squares = _class_sums(features, labels, mean.shape[0])
    batch_mean, batch_var = _moments(count, total, squares)
    if rate_samples is None:
        rate = torch.full_like(count, 1 - momentum)
    else:
        rate = (count / rate_samples).clamp_max(1)
    rate = rate.to(mean.dtype)[:, None]
    mean.add_(rate * (count > 0).to(mean.dtype)[:, None] * (batch_mean.to(mean.dtype) - mean))
    var.add_(rate * (count > 1).to(var.dtype)[:, None] * (batch_var.to(var.dtype) - var))


def _class_sums(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-class count, sum and sum of squares of the flattened features, in float64."""
    flat = features.detach().flatten(1).double()
    labels = labels.to(flat.device)
    count = torch.bincount(labels, minlength=num_classes).double()
    both = torch.cat([flat, flat**2], dim=1)
    sums = flat.new_zeros(num_classes, both.shape[1]).index_add_(0, labels, both)
    return count, sums[:, : flat.shape[1]], sums[:, flat.shape[1] :]


def _moments(
    count: torch.Tensor, total: torch.Tensor, squares: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, unbiased var) from class sums; 0 where a class has too few samples."""
    n = count[:, None]
    mean = total / n.clamp_min(1)
    var = (squares - n * mean**2) / (n - 1).clamp_min(1)
    return mean, var.clamp_min(0)


def aggregate_statistics(
    means: Sequence[torch.Tensor], variances: Sequence[torch.Tensor], weights: Sequence[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 8 with general weights: (sum_i w_i mean_i, sum_i w_i var_i)."""
    mean = sum(w * m for w, m in zip(weights, means, strict=True))
    var = sum(w * v for w, v in zip(weights, variances, strict=True))
    return mean, var


def add_noise(
    mean: torch.Tensor, var: torch.Tensor, std: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The privacy knob of the paper's Table 7: N(0, std^2) noise on the mean and on the std."""
    if std == 0:
        return mean, var
    noisy_mean = mean + std * torch.randn(mean.shape, generator=generator).to(mean)
    noisy_std = var.sqrt() + std * torch.randn(var.shape, generator=generator).to(var)
    return noisy_mean, noisy_std**2


def balanced_labels(num_classes: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """`count` labels, each class `count // num_classes` times; the remainder goes to
    distinct classes drawn at random, so no class is favoured on average."""
    base = torch.arange(num_classes).repeat(count // num_classes)
    extra = torch.randperm(num_classes, generator=generator)[: count % num_classes]
    return torch.cat([base, extra])


@torch.no_grad()
def sample_features(
    mean: torch.Tensor,
    var: torch.Tensor,
    count: int,
    generator: torch.Generator,
    std_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(features, labels): `count` class-balanced draws from N(mean_y, diag(var_y)).

    The std is capped at `std_clip` when given (the authors' code caps it at 0.1). The draws
    are made without autograd, so no gradient can flow back through them.
    """
    labels = balanced_labels(mean.shape[0], count, generator).to(mean.device)
    std = var.clamp_min(0).sqrt()
    if std_clip is not None:
        std = std.clamp_max(std_clip)
    noise = torch.randn((count, mean.shape[1]), generator=generator).to(mean)
    return mean[labels] + std[labels] * noise, labels


@torch.no_grad()
def class_moments(
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]], num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact per-class (mean, unbiased var) of flattened features streamed as (features,
    labels) batches, so memory stays at one batch. A class with fewer than two samples gets
    variance 0 (and mean 0 when absent)."""
    sums = None
    for features, labels in batches:
        batch = _class_sums(features, labels, num_classes)
        sums = batch if sums is None else tuple(a + b for a, b in zip(sums, batch, strict=True))
    if sums is None:
        raise ValueError("class_moments needs at least one batch")
    mean, var = _moments(*sums)
    return mean.float(), var.float()
