"""Client gradient variance (FedImpro, Definition 3): how much the clients' gradients disagree.

    CGV(F, theta) = sum_k p_k ||g_k - g||^2,   g = sum_k p_k g_k,

where g_k is the gradient at theta of client k's mean loss over ALL its samples and p_k its
weight (by default n_k / n, the weights of F = sum_k p_k F_k). The expectation over clients
uses the same p_k as the mean gradient, as in the paper's Eq. 24, so CGV is the p-weighted
variance of the client gradients. Because it is a sum over coordinates it splits exactly
into parameter groups (the paper's Eq. 4): sum over groups == total when the groups cover
every parameter once.

The model is evaluated in eval mode (BatchNorm uses its running statistics), so a client's
gradient does not depend on how its data is batched; a `loss_fn` may switch modes itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.core.errors import InputError
from fedhet.data.clients import ClientData

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def default_groups(model: nn.Module) -> dict[str, list[str]]:
    """Feature extractor vs classifier head (every fedhet model has both); a part without
    parameters (logistic regression's features) is left out."""
    children = dict(model.named_children())
    return {
        name: [name]
        for name in ("features", "head")
        if name in children and any(True for _ in children[name].parameters())
    }


def client_gradient(
    model: nn.Module, client: ClientData, loss_fn: LossFn = cross_entropy, batch_size: int = 1000
) -> dict[str, torch.Tensor]:
    """Gradient of the client's mean loss over all its samples, accumulated batch by batch."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    grads = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()}
    for start in range(0, client.n, batch_size):
        x, y = client.x[start : start + batch_size], client.y[start : start + batch_size]
        loss = loss_fn(model, x, y) * (len(y) / client.n)
        parts = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        for name, part in zip(params, parts, strict=True):
            if part is not None:
                grads[name] += part.double()
    return grads


def _resolve_groups(
    groups: Mapping[str, Sequence[str]], names: Sequence[str]
) -> dict[str, list[str]]:
    """Group -> parameter names; an entry is a parameter name or a module prefix of names."""
    if "total" in groups:
        raise InputError("cgv groups: 'total' is reserved for the whole model; rename that group")
    owner: dict[str, str] = {}
    resolved: dict[str, list[str]] = {}
    for group, entries in groups.items():
        members = []
        for entry in entries:
            matched = [n for n in names if n == entry or n.startswith(entry + ".")]
            if not matched:
                raise InputError(
                    f"cgv groups: {entry!r} (group {group!r}) names no parameter; "
                    f"use parameter names or module prefixes such as {names[0]!r}"
                )
            members += matched
        for name in members:
            if owner.setdefault(name, group) != group:
                raise InputError(
                    f"cgv groups: parameter {name!r} is in both {owner[name]!r} and {group!r}; "
                    "make the groups disjoint"
                )
        resolved[group] = list(dict.fromkeys(members))
    return resolved


def client_gradient_variance(
    model: nn.Module,
    clients: Sequence[ClientData],
    weights: Sequence[float] | None = None,
    loss_fn: LossFn | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
    batch_size: int = 1000,
) -> dict[str, float]:
    """CGV at the model's current parameters: {'total': ..., one entry per group}.

    `weights` default to the client sizes and are normalized to sum to 1; `loss_fn(model, x, y)`
    is the per-batch mean loss (default cross-entropy); `groups` maps a group name to parameter
    names or module prefixes (default: `features` and `head`).
    """
    if not clients:
        raise InputError("cgv: no clients given; pass the partitioned clients")
    weights = [c.n for c in clients] if weights is None else list(weights)
    if len(weights) != len(clients) or min(weights) < 0 or sum(weights) <= 0:
        raise InputError(
            f"cgv weights: need {len(clients)} non-negative weights with a positive sum, "
            f"got {weights}"
        )
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    resolved = _resolve_groups(default_groups(model) if groups is None else groups, names)
    was_training = model.training
    model.eval()
    try:
        spread = _weighted_spread(model, clients, weights, loss_fn or cross_entropy, batch_size)
    finally:
        model.train(was_training)
    per_param = {name: float(m2.sum()) for name, m2 in spread.items()}
    out = {"total": sum(per_param.values())}
    out.update({g: sum(per_param[n] for n in names) for g, names in resolved.items()})
    return out


def _weighted_spread(
    model: nn.Module,
    clients: Sequence[ClientData],
    weights: Sequence[float],
    loss_fn: LossFn,
    batch_size: int,
) -> dict[str, torch.Tensor]:
    """Per coordinate, sum_k w_k (g_k - g)^2 with w normalized, in one pass (West's weighted
    incremental update): memory stays at two model copies however many clients there are,
    and no large sums cancel as in sum_k w_k g_k^2 - g^2."""
    mean: dict[str, torch.Tensor] = {}
    spread: dict[str, torch.Tensor] = {}
    seen = 0.0
    total = float(sum(weights))
    for client, raw_weight in zip(clients, weights, strict=True):
        weight = raw_weight / total
        if weight == 0:
            continue
        grad = client_gradient(model, client, loss_fn, batch_size)
        seen += weight
        for name, g in grad.items():
            if name not in mean:
                mean[name], spread[name] = g.clone(), torch.zeros_like(g)
                continue
            delta = g - mean[name]
            mean[name] += delta * (weight / seen)
            spread[name] += weight * delta * (g - mean[name])
    return spread
