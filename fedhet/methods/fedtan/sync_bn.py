"""FedTAN's synchronized first local step: BatchNorm statistics and their gradients shared.

At the first local step of a round every client holds the same weights. FedTAN (paper
Algorithms 2 and 3) runs that step in lockstep: in the forward pass, at each BatchNorm layer
the clients upload their batch means, the server averages them with the weights p_i (Eq. 39),
the clients upload their variances around that global mean, the server averages them (Eq. 40)
and every client normalizes with the global statistics; in the backward pass, from the top
BN layer down, the clients upload their gradients w.r.t. the layer's mean and variance, the
server averages them (Eq. 41) and every client continues its own backward pass below the
layer with the averaged gradients. `forward_only` is the paper's "Algorithm 2" alone (global
statistics forward, each client's own statistic gradients backward); `local` is plain BN.

Design: one process, two passes, no threads. Lockstep threads would need a barrier inside
autograd's backward, which deadlocks on CUDA (all backward work for a device runs on one
autograd worker thread) and makes errors and determinism delicate. Instead:

1. Server pass. BatchNorm is the only layer that mixes samples, so running every client in
   lockstep up to a BN layer is the same computation as one forward of the union batch in
   which that BN layer computes Eq. 39 from the clients' row blocks and Eq. 40 around the
   global mean. Backpropagating F = sum_i p_i F_i (F_i: client i's mean loss) through it,
   the signal at client i's rows is p_i times client i's own FedTAN signal (true at the loss
   and kept by every per-sample layer and by every synchronized BN layer), so the gradient
   at each layer's shared mean and variance is sum_i p_i grad F_i: exactly Eq. 41.
2. Client pass. Each client runs its own forward and backward; each BN layer takes the
   server's statistics in the forward pass and (fedtan) the server's statistic gradients in
   the backward pass, and the client's own chain rule carries them below the layer
   (paper Eq. 62: d mean / dY = 1/n_i, d var / dY = 2 (Y - mean) / n_i).

This costs about two ordinary steps, is exact, deterministic and device-agnostic. As in the
paper (Eq. 65), a statistic's gradient is taken through the normalization only: a client's
variance is computed around the received mean held fixed. In the centralized computation the
variance's derivative w.r.t. the global mean is identically zero, so nothing is lost.

What the synchronized step equals: with p = weights / sum(weights), sum_i p_i g_i (g_i: the
client gradients of `fedtan`) is the gradient of sum_i p_i F_i on the union batch whose BN
statistics weight each sample of client i by p_i / b_i (b_i: its batch size). When p_i is
proportional to b_i this is plain centralized training: one forward of the concatenated
batch in train mode, loss = mean over the union (the paper's Eq. 9).

Running statistics (fedtan, forward_only): each synchronized BN layer that tracks them is
updated once with the global statistics, as torch would for the union batch:
running_mean <- (1 - m) running_mean + m mean, running_var <- (1 - m) running_var
+ m var * n / (n - 1), n = values per channel in the union batch, m = momentum (or
1 / num_batches_tracked when momentum is None), and num_batches_tracked += 1. `local` leaves
them untouched (each client would update its own copy).

Which layers are synchronized: every BatchNorm call that uses batch statistics by torch's rule
(layer in train mode, or it tracks no running statistics); layers normalizing with running
statistics (frozen, as in FedTAN-II) are left alone. The model must call its BN layers in the
same order for every client and must be deterministic apart from BN (no active dropout).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd

from fedhet.plugin import InputError, RunError

Mode = Literal["fedtan", "forward_only", "local"]
LossFn = Callable[[Tensor, Tensor], Tensor]
Batch = tuple[Tensor, Tensor]


@dataclass
class LayerStatistics:
    """The global statistics one BN call normalized with (biased variance, as in Eq. 40)."""

    name: str
    mean: Tensor
    var: Tensor


@dataclass
class SyncResult:
    """Outcome of one synchronized step; lists of clients are in the order of `batches`."""

    gradients: list[dict[str, Tensor]]  # per client: parameter name -> gradient of F_i
    losses: list[float]  # per client: its mean loss F_i
    statistics: list[LayerStatistics]  # per synchronized BN call, in call order; [] for local
    communication: dict[str, int | list[int]]  # as `communication_cost`, for the calls made


# --- public API ---------------------------------------------------------------------------


def bn_layers(model: nn.Module) -> list[nn.Module]:
    """The model's BatchNorm layers (any dimension), in registration order."""
    return [layer for _, layer in _named_bn_layers(model)]


def communication_cost(model: nn.Module, mode: Mode) -> dict[str, int | list[int]]:
    """Extra traffic of one synchronized step, assuming each BN layer runs once per forward.

    values_per_layer: values each client uploads for a layer (fedtan: mean, var, grad-mean,
    grad-var, 4C; forward_only: mean and var, 2C; local: 0); the server sends each client as
    many back. values: their sum over layers. extra_rounds: server round trips added to an
    iteration (fedtan 3L: two per layer forward, one backward; forward_only 2L; local 0).
    rounds_per_iteration: extra_rounds + the FedAvg model exchange (fedtan: the paper's 3L+1).
    """
    _check_mode(mode)
    return _cost([layer.num_features for layer in bn_layers(model)], mode)


def synchronized_gradients(
    model: nn.Module,
    batches: Sequence[Batch],
    weights: Sequence[float],
    loss_fn: LossFn = F.cross_entropy,
    mode: Mode = "fedtan",
) -> SyncResult:
    """One synchronized local step of clients that all hold `model`'s weights.

    batches[i] = (x_i, y_i) is client i's batch, weights[i] its data share p_i (normalized to
    sum to 1), loss_fn(outputs, targets) a mean loss. Returns each client's gradients and
    loss; the model's parameters and .grad are untouched, its running statistics updated as
    the module docstring states.
    """
    _check_inputs(model, batches, weights, mode)
    total = float(sum(weights))
    shares = [float(w) / total for w in weights]
    with torch.enable_grad():
        calls = [] if mode == "local" else _server_pass(model, batches, shares, loss_fn, mode)
        client = _ClientPass(calls)
        handler = _local_batch_norm if mode == "local" else client.batch_norm
        with _batch_norm_replaced(model, handler):
            results = [client.run(model, x, y, loss_fn) for x, y in batches]
    for call in calls:
        _update_running_statistics(call)
    return SyncResult(
        gradients=[grads for grads, _ in results],
        losses=[loss for _, loss in results],
        statistics=[LayerStatistics(c.name, c.mean, c.var) for c in calls],
        communication=_cost(_synchronized_channels(model, calls), mode),
    )


# --- the two passes -----------------------------------------------------------------------


@dataclass
class _LayerCall:
    """What the server exchanged at one BN call."""

    layer: _BatchNorm
    name: str
    mean: Tensor
    var: Tensor
    count: int  # values per channel in the union batch
    grad_mean: Tensor | None = None  # None: not exchanged (forward_only)
    grad_var: Tensor | None = None


class _UnionBatchNorm:
    """BN over the union batch computing the server's statistics from the clients' rows."""

    def __init__(self, shares: list[float], sizes: list[int], names: dict[nn.Module, str]):
        self.shares = shares
        self.sizes = sizes
        self.names = names
        self.calls: list[_LayerCall] = []

    def __call__(self, layer: _BatchNorm, y: Tensor) -> Tensor:
        dims = _reduce_dims(y)
        moments = [torch.var_mean(b, dims, correction=0) for b in y.split(self.sizes)]
        mean = _weighted_sum(self.shares, [m for _, m in moments])  # Eq. 39
        var = _weighted_sum(  # Eq. 40: each client's variance around the global mean
            self.shares, [_around(v, m, mean.detach()) for v, m in moments]
        )
        count = y.numel() // y.shape[1]
        if count < 2:
            raise InputError("batches: the union batch needs more than one value per channel")
        self.calls.append(_LayerCall(layer, self.names[layer], mean, var, count))
        return _normalize(y, mean, var, layer)


def _server_pass(
    model: nn.Module, batches: Sequence[Batch], shares: list[float], loss_fn: LossFn, mode: Mode
) -> list[_LayerCall]:
    """All clients' lockstep forward as one union batch; for fedtan its backward (Eq. 41)."""
    sizes = [len(x) for x, _ in batches]
    union = _UnionBatchNorm(shares, sizes, _names(model))
    with _batch_norm_replaced(model, union), torch.set_grad_enabled(mode == "fedtan"):
        outputs = model(torch.cat([x for x, _ in batches])).split(sizes)
    calls = union.calls
    if mode == "fedtan":
        losses = [loss_fn(out, y) for out, (_, y) in zip(outputs, batches, strict=True)]
        stats = [s for call in calls for s in (call.mean, call.var)]
        grads = _gradients_or_zeros(_weighted_sum(shares, losses), stats)
        for call, grad_mean, grad_var in zip(calls, grads[::2], grads[1::2], strict=True):
            call.grad_mean, call.grad_var = grad_mean, grad_var
    for call in calls:
        call.mean, call.var = call.mean.detach(), call.var.detach()
    return calls


class _ClientPass:
    """Each client's own forward and backward with the server's exchanged values substituted."""

    def __init__(self, calls: list[_LayerCall]):
        self.calls = calls
        self.position = 0

    def batch_norm(self, layer: _BatchNorm, y: Tensor) -> Tensor:
        call = self._next_call(layer)
        dims = _reduce_dims(y)
        own_var, own_mean = torch.var_mean(y, dims, correction=0)
        mean = _Exchanged.apply(own_mean, call.mean, call.grad_mean)
        var = _Exchanged.apply(_around(own_var, own_mean, call.mean), call.var, call.grad_var)
        return _normalize(y, mean, var, layer)

    def run(
        self, model: nn.Module, x: Tensor, y: Tensor, loss_fn: LossFn
    ) -> tuple[dict[str, Tensor], float]:
        """(parameter name -> gradient, loss) of one client."""
        self.position = 0
        loss = loss_fn(model(x), y)
        if self.position != len(self.calls):
            raise RunError(_ORDER_MESSAGE)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        grads = torch.autograd.grad(
            loss, [p for _, p in named], allow_unused=True, materialize_grads=True
        )
        return {n: g for (n, _), g in zip(named, grads, strict=True)}, loss.item()

    def _next_call(self, layer: _BatchNorm) -> _LayerCall:
        if self.position >= len(self.calls) or self.calls[self.position].layer is not layer:
            raise RunError(_ORDER_MESSAGE)
        self.position += 1
        return self.calls[self.position - 1]


_ORDER_MESSAGE = (
    "model: its BatchNorm layers ran in a different order for different clients; "
    "FedTAN needs the same sequence of BN calls for every client (no data-dependent branches)"
)


class _Exchanged(torch.autograd.Function):
    """A client's statistic replaced by the server's value and, when the server sends one,
    its gradient by the server's gradient (Algorithm 2 lines 8 and 14, Algorithm 3 line 8)."""

    @staticmethod
    def forward(ctx, own: Tensor, server_value: Tensor, server_grad: Tensor | None) -> Tensor:
        # `own` only routes the gradient: the client's chain rule continues below it
        ctx.server_grad = server_grad
        return server_value.clone()

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        return (grad if ctx.server_grad is None else ctx.server_grad), None, None


def _local_batch_norm(layer: _BatchNorm, y: Tensor) -> Tensor:
    """Plain train-mode BN with the client's own batch statistics, running stats untouched."""
    return F.batch_norm(y, None, None, layer.weight, layer.bias, True, 0.0, layer.eps)


# --- helpers --------------------------------------------------------------------------------


def _named_bn_layers(model: nn.Module) -> Iterator[tuple[str, _BatchNorm]]:
    return ((n, m) for n, m in model.named_modules() if isinstance(m, _BatchNorm))


def _names(model: nn.Module) -> dict[nn.Module, str]:
    return {layer: name for name, layer in _named_bn_layers(model)}


def _uses_batch_statistics(layer: _BatchNorm) -> bool:
    return layer.training or layer.running_mean is None


def _synchronized_channels(model: nn.Module, calls: list[_LayerCall]) -> list[int]:
    """Channels of the BN calls the step synchronized (local: of those it would have)."""
    if calls:
        return [call.layer.num_features for call in calls]
    return [layer.num_features for layer in bn_layers(model) if _uses_batch_statistics(layer)]


@contextmanager
def _batch_norm_replaced(
    model: nn.Module, handler: Callable[[_BatchNorm, Tensor], Tensor]
) -> Iterator[None]:
    """Route every batch-statistics BN call to handler(layer, input); restored on exit."""
    layers = [layer for layer in bn_layers(model) if _uses_batch_statistics(layer)]
    for layer in layers:
        layer.forward = partial(handler, layer)  # instance attribute shadows the class method
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward


def _reduce_dims(y: Tensor) -> list[int]:
    return [0, *range(2, y.dim())]


def _channels(stat: Tensor, like: Tensor) -> Tensor:
    """A per-channel vector shaped to broadcast over `like` (N, C, ...)."""
    return stat.view(1, -1, *([1] * (like.dim() - 2)))


def _weighted_sum(shares: Sequence[float], values: Sequence[Tensor]) -> Tensor:
    return sum(p * v for p, v in zip(shares, values, strict=True))


def _gradients_or_zeros(output: Tensor, inputs: list[Tensor]) -> list[Tensor]:
    """d output / d input; zeros for inputs outside the graph (e.g. BN of the raw input)."""
    live = [t for t in inputs if t.requires_grad]
    grads = iter(torch.autograd.grad(output, live, allow_unused=True, materialize_grads=True))
    return [next(grads) if t.requires_grad else torch.zeros_like(t) for t in inputs]


def _around(var: Tensor, mean: Tensor, center: Tensor) -> Tensor:
    """A batch's mean square deviation from `center`, from its own (biased) moments."""
    return var + (mean - center) ** 2


def _normalize(y: Tensor, mean: Tensor, var: Tensor, layer: _BatchNorm) -> Tensor:
    """Eq. 1 as y * scale + shift, scale = gamma / sqrt(var + eps), shift = beta - mean * scale."""
    scale = torch.rsqrt(var + layer.eps)
    if layer.affine:
        scale = scale * layer.weight
    shift = -mean * scale + (layer.bias if layer.affine else 0)
    return y * _channels(scale, y) + _channels(shift, y)


@torch.no_grad()
def _update_running_statistics(call: _LayerCall) -> None:
    layer = call.layer
    if layer.running_mean is None:
        return
    layer.num_batches_tracked += 1
    m = layer.momentum if layer.momentum is not None else 1.0 / int(layer.num_batches_tracked)
    unbiased = call.var * (call.count / (call.count - 1))
    layer.running_mean.mul_(1 - m).add_(m * call.mean)
    layer.running_var.mul_(1 - m).add_(m * unbiased)


def _cost(channels: list[int], mode: Mode) -> dict[str, int | list[int]]:
    vectors_per_layer, rounds_per_layer = {
        "fedtan": (4, 3),
        "forward_only": (2, 2),
        "local": (0, 0),
    }[mode]
    per_layer = [vectors_per_layer * c for c in channels]
    extra_rounds = rounds_per_layer * len(channels)
    return {
        "bn_layers": len(channels),
        "values_per_layer": per_layer,
        "values": sum(per_layer),
        "extra_rounds": extra_rounds,
        "rounds_per_iteration": extra_rounds + 1,
    }


def _check_mode(mode: str) -> None:
    if mode not in get_args(Mode):
        raise InputError(f"mode={mode!r} is unknown; use one of {list(get_args(Mode))}")


def _check_inputs(
    model: nn.Module, batches: Sequence[Batch], weights: Sequence[float], mode: str
) -> None:
    _check_mode(mode)
    if not batches or len(batches) != len(weights):
        raise InputError(
            f"weights: need one weight per client batch, got {len(weights)} weights for "
            f"{len(batches)} batches (and at least one batch)"
        )
    if not all(math.isfinite(float(w)) and float(w) > 0 for w in weights):
        raise InputError(f"weights must be positive finite data shares, got {list(weights)}")
    if any(len(x) == 0 or len(x) != len(y) for x, y in batches):
        raise InputError("batches: every client batch needs matching, non-empty inputs and targets")
    if any(isinstance(m, _DropoutNd) and m.training and m.p > 0 for m in model.modules()):
        raise InputError(
            "model: active dropout makes the synchronized step ill-defined; "
            "use a model without dropout or put dropout layers in eval mode"
        )
