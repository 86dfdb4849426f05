"""Small network parts that several methods build on: a layer that scales the gradient flowing
back through it (DANN's gradient reversal, FedImpro's reweighting), a loss term that counts by
its gradient alone (DANN's domain loss beside the recorded CE), a seeded 3-layer MLP head
(MOON's and FedBR's projection heads, DANN's domain classifier), and a model carrying such a
part beside the classifier."""

from __future__ import annotations

import torch
from torch import nn

from fedhet.core.rng import derive_seed
from fedhet.models import FedModel


class _ScaleGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


def scale_gradient(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x forward; the gradient flowing back through it is multiplied by `scale` (a negative
    scale reverses it: DANN's R_lambda is `scale_gradient(x, -lambda)`)."""
    return _ScaleGradient.apply(x, scale)


def gradient_only(term: torch.Tensor) -> torch.Tensor:
    """Zero forward (NaN where `term` is not finite), `term`'s gradient backward: added to a
    loss, it moves the parameters as `term` does while the loss's value, the recorded train
    loss, leaves it out."""
    return term - term.detach()


def seeded_mlp(in_dim: int, width: int, out_dim: int, seed: int, *path: str) -> nn.Sequential:
    """in_dim -> width -> width -> out_dim, ReLU between, initialized from the seed derived from
    (`seed`, *`path`); the global RNG is left untouched, so the rest of the model starts as it
    would without it."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, *path))
        return nn.Sequential(
            nn.Linear(in_dim, width),
            nn.ReLU(),
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Linear(width, out_dim),
        )


class WithPart(nn.Module):
    """The classifier `net` and one more module trained beside it, registered under `name`
    (its state entries are `name.*`); forward gives the classifier's logits."""

    def __init__(self, net: FedModel, name: str, part: nn.Module):
        super().__init__()
        self.net = net
        self.add_module(name, part)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
