"""Local SGD of an MLP client with hand-derived gradients and the update fused into them.

Small clients train on tiny batches (cross-device: ~60 samples, batch 10), where autograd's and
the optimizer's per-operation bookkeeping costs more than the arithmetic. For a chain of Linear,
ReLU and Flatten layers (`fedhet.engine.cohort_gradients.linear_chain`: MLPs, logistic regression)
with cross-entropy and plain SGD, the backward pass is three lines per layer, and each weight's
gradient never needs to exist: `W.addmm_(delta.T, h, beta=1 - lr wd, alpha=-lr / batch)`
computes it and applies the step, weight decay included, in one pass over W, which stays in the
core's cache for the client's whole local training. A client's samples are gathered once (in
groups of up to GATHERED_SAMPLES) in the order its steps take them, so a step's batch is a view;
the parameter-free layers below the first Linear run once a group, and the losses are read back
once a group.

A proximal term mu/2 ||w - anchor||^2 in the loss (FedProx's, `fedhet.engine.client_step.Proximal`)
is weight decay toward the anchor: its gradient mu (w - anchor) joins the shrink of the same
`addmm_` (beta=1 - lr (wd + mu)), and lr mu anchor is added to the parameters, which the client's
copy holds in one flat tensor: one `add_` a step, and one `dist` for the term's value in the
step's loss, however many layers.

The arithmetic is torch.optim.SGD's (gradient of the batch-mean cross-entropy plus the proximal
term's plus weight decay times the weight, then the step), rounded differently in float32 (about
1e-8 relative on a client's update), so a run records the executor it ran on (`runtime.clients`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.data.clients import take_rows
from fedhet.engine.client_step import Proximal
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


GATHERED_SAMPLES = 4096  # samples gathered at once: a bound on the copy, however many steps


class _Batch(NamedTuple):
    """A step's samples, gathered: inputs (below the first Linear already applied), labels,
    labels one-hot, and ones (a batch's bias gradient is delta.T @ ones)."""

    x: Tensor
    y: Tensor
    one_hot: Tensor
    ones: Tensor


def fused_sgd(
    chain: list[Layer],
    start: Tensors,
    x: Tensor,
    y: Tensor,
    batches: Iterable[Tensor],
    lr: float,
    weight_decay: float = 0.0,
    proximal: Proximal | None = None,
) -> tuple[Tensors, LocalStats]:
    """(the client's state after SGD over `batches` of (x, y) from `start`, its stats), with
    `proximal`'s term in the loss if given.

    Raises `Divergence` at the first step whose loss is not finite, as `local_sgd` does.
    """
    mu = proximal.mu if proximal is not None else 0.0
    state, anchored = _copy(start, proximal.anchor if mu else {})
    layers = [_Bound.of(layer, state) for layer in chain]
    first_linear = next(i for i, layer in enumerate(layers) if layer.kind == "linear")
    classes = next(layer.weight for layer in reversed(layers) if layer.kind == "linear").shape[0]
    eye = torch.eye(classes, dtype=x.dtype, device=x.device)
    rates = _Rates(lr, 1.0 - lr * (weight_decay + mu), lr * mu)
    values: list[float] = []
    for group in _groups(list(batches)):
        gathered = _gather(layers[:first_linear], x, y, eye, group)
        steps = [_step(layers[first_linear:], batch, rates, anchored) for batch in gathered]
        done = len(values)
        values += _losses(steps, mu).tolist()  # read once a group, not at every step
        for step in range(done, len(values)):  # the group's later steps ran on regardless
            if not math.isfinite(values[step]):
                raise Divergence(step, values[step])
    if not values:
        return state, LocalStats(0, 0.0)
    return state, LocalStats(len(values), sum(values) / len(values), first_loss=values[0])


class _Rates(NamedTuple):
    """A step's factors: the learning rate, the weights' shrink 1 - lr (weight decay + mu), and
    the pull lr mu toward the proximal term's anchor."""

    lr: float
    shrink: float
    pull: float


class _Anchored(NamedTuple):
    """The client's parameters as one flat tensor (the state's entries are views of it), and
    the proximal term's anchor flattened alike."""

    parameters: Tensor
    anchor: Tensor


def _copy(start: Tensors, anchor: Tensors) -> tuple[Tensors, _Anchored | None]:
    """The client's copy of `start` to train, with its entries that `anchor` names held in one
    flat tensor (None: no anchor)."""
    names = [n for n in start if n in anchor]
    if not names:
        return {n: t.clone() for n, t in start.items()}, None
    flat = torch.cat([start[n].flatten() for n in names])
    parts = dict(zip(names, flat.split([start[n].numel() for n in names]), strict=True))
    state = {n: parts[n].view_as(t) if n in parts else t.clone() for n, t in start.items()}
    return state, _Anchored(flat, torch.cat([anchor[n].flatten() for n in names]))


def _losses(steps: list[tuple[Tensor, Tensor | None]], mu: float) -> Tensor:
    """The steps' losses: their batches' mean cross-entropy, plus mu/2 the squared distance of
    the parameters from their anchor (none without a proximal term)."""
    data = torch.stack([loss for loss, _ in steps])
    if steps[0][1] is None:
        return data
    return data + 0.5 * mu * torch.stack([distance for _, distance in steps]).square()


def _groups(batches: list[Tensor]) -> Iterator[list[Tensor]]:
    """Consecutive batches, GATHERED_SAMPLES samples or fewer a group (or one batch)."""
    group, samples = [], 0
    for batch in batches:
        if group and samples + batch.shape[0] > GATHERED_SAMPLES:
            yield group
            group, samples = [], 0
        group.append(batch)
        samples += batch.shape[0]
    if group:
        yield group


def _gather(
    below: list[_Bound], x: Tensor, y: Tensor, eye: Tensor, batches: list[Tensor]
) -> list[_Batch]:
    """The batches' samples gathered at once in the order the steps take them (a step's batch
    is then a view), with the parameter-free layers `below` the first Linear applied once. The
    gathered inputs are a copy (take_rows), so the steps' in-place ReLU never reaches `x`."""
    order, sizes = torch.cat(batches), [batch.shape[0] for batch in batches]
    inputs, labels = take_rows(x, order), take_rows(y, order)
    for layer in below:
        inputs = layer.forward(inputs)
    parts = (inputs, labels, take_rows(eye, labels), inputs.new_ones(order.shape[0]))
    return [_Batch(*batch) for batch in zip(*(part.split(sizes) for part in parts), strict=True)]


@dataclass(frozen=True)
class _Bound:
    """A layer of the chain with its tensors in the client's state (`weight_t` a view)."""

    kind: str
    weight: Tensor | None = None
    weight_t: Tensor | None = None
    bias: Tensor | None = None

    @classmethod
    def of(cls, layer: Layer, state: Tensors) -> _Bound:
        if layer.kind != "linear":
            return cls(layer.kind)
        weight = state[layer.weight]
        return cls("linear", weight, weight.T, state[layer.bias] if layer.bias else None)

    def forward(self, h: Tensor) -> Tensor:
        """The layer's output; a ReLU overwrites `h` (a tensor this module made), which keeps
        the sign its backward needs."""
        if self.kind == "flatten":
            return h.flatten(1)
        if self.kind == "relu":
            return h.clamp_min_(0)
        if self.bias is None:
            return h @ self.weight_t
        return torch.addmm(self.bias, h, self.weight_t)


def _step(
    layers: list[_Bound], batch: _Batch, rates: _Rates, anchored: _Anchored | None
) -> tuple[Tensor, Tensor | None]:
    """One SGD step in place on the layers' tensors (the chain from its first linear layer on);
    (the batch's mean cross-entropy, the parameters' distance from their anchor) before it."""
    distance = None if anchored is None else torch.dist(*anchored)
    inputs = []  # each layer's input, for its backward
    h = batch.x
    for layer in layers:
        inputs.append(h)
        h = layer.forward(h)
    log_p = torch.log_softmax(h, 1)
    loss = F.nll_loss(log_p, batch.y)
    delta = log_p.exp_().sub_(batch.one_hot)  # d(summed loss)/d(logits)
    rate = rates.lr / batch.y.shape[0]  # the step follows the gradient of the summed loss
    for i in range(len(layers) - 1, -1, -1):
        layer, h = layers[i], inputs[i]
        if layer.kind == "relu":
            delta = torch.ops.aten.threshold_backward(delta, h, 0)
        elif layer.kind == "flatten":
            delta = delta.view_as(h)
        else:
            down = delta @ layer.weight if i > 0 else None  # before the step
            delta_t = delta.T
            # W (1 - lr (wd + mu)) - rate delta.T h (+ lr mu anchor): torch.optim.SGD's step
            layer.weight.addmm_(delta_t, h, beta=rates.shrink, alpha=-rate)
            if layer.bias is not None:
                layer.bias.addmv_(delta_t, batch.ones, beta=rates.shrink, alpha=-rate)
            delta = down
    if anchored is not None:
        anchored.parameters.add_(anchored.anchor, alpha=rates.pull)
    return loss, distance
