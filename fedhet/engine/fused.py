"""Local SGD of an MLP client with hand-derived gradients and the update fused into them.

Small clients train on tiny batches (cross-device: ~60 samples, batch 10), where autograd's and
the optimizer's per-operation bookkeeping costs more than the arithmetic. For a chain of Linear,
ReLU and Flatten layers (`fedhet.engine.vectorized.linear_chain`: MLPs, logistic regression)
with cross-entropy and plain SGD, the backward pass is three lines per layer, and each weight's
gradient never needs to exist: `W.addmm_(delta.T, h, alpha=-lr)` computes it and applies the
step in one pass over W, which stays in the core's cache for the client's whole local training.

The arithmetic is torch.optim.SGD's (gradient of the batch-mean cross-entropy, weight decay
folded in as W (1 - lr wd), then the step), rounded differently in float32 (about 1e-8 relative
on a client's update), so a run records the executor it ran on (`runtime.clients`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.engine.local import Divergence, LocalStats
from fedhet.engine.tensors import Tensors


@dataclass(frozen=True)
class Layer:
    """One layer of the chain: 'linear' (with its parameter names), 'relu' or 'flatten'."""

    kind: str
    weight: str | None = None
    bias: str | None = None


def chain_layers(model: nn.Module, layers: list[nn.Module]) -> list[Layer]:
    """`layers` (a linear chain of `model`, in forward order) by parameter name."""
    names = {id(p): n for n, p in model.named_parameters()}
    chain = []
    for module in layers:
        if isinstance(module, nn.Linear):
            bias = names[id(module.bias)] if module.bias is not None else None
            chain.append(Layer("linear", names[id(module.weight)], bias))
        else:
            chain.append(Layer("relu" if isinstance(module, nn.ReLU) else "flatten"))
    return chain


def fused_sgd(
    chain: list[Layer],
    start: Tensors,
    x: Tensor,
    y: Tensor,
    batches: Iterable[Tensor],
    lr: float,
    weight_decay: float = 0.0,
) -> tuple[Tensors, LocalStats]:
    """(the client's state after SGD over `batches` of (x, y) from `start`, its stats).

    Raises `Divergence` at the first step whose loss is not finite, as `local_sgd` does.
    """
    state = {n: t.clone() for n, t in start.items()}
    classes = state[next(layer.weight for layer in reversed(chain) if layer.weight)].shape[0]
    one_hot = F.one_hot(y, classes).to(x.dtype)
    shrink = 1.0 - lr * weight_decay
    first_linear = next(i for i, layer in enumerate(chain) if layer.kind == "linear")
    total, first, steps = 0.0, math.nan, 0
    for step, idx in enumerate(batches):
        loss = _step(chain, first_linear, state, x[idx], y[idx], one_hot[idx], lr, shrink)
        if not math.isfinite(loss):
            raise Divergence(step, loss)
        total += loss
        first = loss if steps == 0 else first
        steps += 1
    return state, LocalStats(steps, total / max(steps, 1), first_loss=first)


def _step(
    chain: list[Layer],
    first_linear: int,
    state: Tensors,
    x: Tensor,
    y: Tensor,
    one_hot: Tensor,
    lr: float,
    shrink: float,
) -> float:
    """One SGD step in place on `state`; the batch's mean cross-entropy before it. The layers
    below `chain[first_linear]` (a Flatten) need no backward."""
    inputs = []  # each layer's input, for its backward
    h = x
    for layer in chain:
        inputs.append(h)
        if layer.kind == "flatten":
            h = h.flatten(1)
        elif layer.kind == "relu":
            h = h.clamp_min(0)
        elif layer.bias is None:
            h = h @ state[layer.weight].T
        else:
            h = torch.addmm(state[layer.bias], h, state[layer.weight].T)
    log_p = torch.log_softmax(h, 1)
    loss = float(F.nll_loss(log_p, y))
    # d(batch sum of losses)/d(logits); the mean's 1/batch is folded into the step size
    delta = log_p.exp_().sub_(one_hot)
    rate = lr / y.shape[0]
    for i in range(len(chain) - 1, first_linear - 1, -1):
        layer, h = chain[i], inputs[i]
        if layer.kind == "relu":
            delta = torch.ops.aten.threshold_backward(delta, h, 0)
        elif layer.kind == "flatten":
            delta = delta.view_as(h)
        else:
            weight = state[layer.weight]
            down = delta @ weight if i > first_linear else None  # before the weight changes
            if shrink != 1.0:
                weight.mul_(shrink)
            weight.addmm_(delta.T, h, alpha=-rate)
            if layer.bias is not None:
                bias = state[layer.bias]
                if shrink != 1.0:
                    bias.mul_(shrink)
                bias.sub_(delta.sum(0), alpha=rate)
            delta = down
    return loss
