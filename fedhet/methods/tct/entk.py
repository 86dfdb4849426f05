"""TCT's convexification: empirical-NTK features of a bootstrapped model.

phi(x) = d f_1(x; theta_0) / d theta, the gradient of the FIRST output logit with respect to
every trainable parameter (in `model.parameters()` order, flattened and concatenated), where
theta_0 is the stage-1 model with its head re-initialized. Only `p` coordinates of phi are
kept, chosen once by a seeded mask that every client and the test set share.

Features are computed in eval mode (BatchNorm uses its running statistics), so a sample's
feature does not depend on which other samples share its batch. That independence is what
makes the batched computation exact: one forward and one backward pass of sum_b f_1(x_b)
give, at every module, the sample's input a_b and output gradient delta_b, and a module's
per-sample parameter gradient depends only on (a_b, delta_b). Linear and Conv2d layers then
produce just the selected coordinates (sum over positions of delta[o] * a[r]), gathered pair
by pair, except where so many of a convolution's weights are kept that its whole per-sample
gradient (one convolution grouped by sample) is cheaper than the gather; any other module
with parameters (norm layers, custom modules) gets torch.func's vmap(grad) of its own
functional_call. Features are written straight into the chunk's [B, p] block.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from fedhet.plugin import InputError, RunError

# Elements in one temporary product block of the Linear/Conv2d coordinate gather: 1 MiB of
# float32, so the block is still in the L2 cache when it is multiplied and summed (a 16 MiB
# block made the simple_cnn gather 1.5-3x slower).
_GATHER_BUDGET = 1 << 18
# Measured on one CPU thread (float32): a gathered multiply-add costs about as much as 25
# multiply-adds of the grouped convolution that gives a convolution's whole per-sample gradient.
_GATHER_COST = 25
# Samples per block of a convolution's whole per-sample gradient, which bounds its memory.
_FULL_SAMPLES = 32


def reinit_head(model: nn.Module, seed: int) -> None:
    """Re-draw `model.head` (an nn.Linear) from PyTorch's default Linear init, seeded."""
    head = getattr(model, "head", None)
    if not isinstance(head, nn.Linear):
        raise InputError(
            "TCT needs a model whose last layer `head` is an nn.Linear; use a fedhet model"
        )
    generator = torch.Generator().manual_seed(seed)
    bound = 1.0 / math.sqrt(head.in_features)
    with torch.no_grad():
        for param in (head.weight, head.bias):
            if param is not None:
                drawn = torch.empty(param.shape, dtype=param.dtype).uniform_(
                    -bound, bound, generator=generator
                )
                param.copy_(drawn)


def trainable_parameter_count(model: nn.Module) -> int:
    """P, the length of the full eNTK feature (the flattened trainable parameters)."""
    return sum(param.numel() for param in model.parameters() if param.requires_grad)


def coordinate_mask(num_params: int, p: int, seed: int) -> Tensor:
    """Sorted indices of `p` random coordinates of [0, num_params); all if p >= num_params."""
    if p <= 0:
        raise InputError(f"entk.p must be a positive number of coordinates, got {p}")
    if num_params <= 0:
        raise InputError(
            f"the model has no trainable parameters to take eNTK features from ({num_params})"
        )
    if p >= num_params:
        return torch.arange(num_params)
    generator = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(num_params, generator=generator)[:p]
    return torch.sort(chosen).values


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Put every submodule in eval mode, then restore each one's own previous mode."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def _model_tensor(model: nn.Module) -> Tensor:
    """Any parameter, for the model's device and dtype."""
    try:
        return next(model.parameters())
    except StopIteration:
        raise InputError("the model has no parameters to take eNTK features from") from None


def _check_coords(coords: Tensor, total: int) -> Tensor:
    coords = coords.to(torch.long).cpu()
    if coords.ndim != 1 or coords.numel() == 0:
        raise InputError(
            "entk coordinates must be a non-empty 1-D index tensor; use coordinate_mask"
        )
    if int(coords.min()) < 0 or int(coords.max()) >= total:
        raise InputError(
            f"entk coordinates must lie in [0, {total}); build them with coordinate_mask"
        )
    if bool((coords[1:] <= coords[:-1]).any()):
        raise InputError(
            "entk coordinates must be sorted and distinct; build them with coordinate_mask"
        )
    return coords


# --- which selected coordinate lives where ----------------------------------------------


@dataclass(frozen=True)
class _Selection:
    """The selected coordinates inside one parameter and the feature columns they fill."""

    local_name: str  # the parameter's name inside its owning module
    index: Tensor  # flat indices into the parameter
    columns: slice  # where these coordinates go in the [N, p] feature matrix


def _plan(model: nn.Module, coords: Tensor) -> dict[nn.Module, list[_Selection]]:
    """Owning module -> its selected parameters, from the global coordinate mask."""
    owners: dict[int, tuple[nn.Module, str]] = {}
    for _, module in model.named_modules():
        for local_name, param in module.named_parameters(recurse=False):
            if id(param) in owners:
                raise RunError("eNTK features do not support a parameter shared between modules")
            owners[id(param)] = (module, local_name)
    trainable = [param for param in model.parameters() if param.requires_grad]
    coords = _check_coords(coords, sum(param.numel() for param in trainable))
    plan: dict[nn.Module, list[_Selection]] = defaultdict(list)
    offset, column = 0, 0
    for param in trainable:
        inside = coords[(coords >= offset) & (coords < offset + param.numel())] - offset
        if inside.numel():
            module, local_name = owners[id(param)]
            columns = slice(column, column + inside.numel())
            plan[module].append(_Selection(local_name, inside.to(param.device), columns))
            column += inside.numel()
        offset += param.numel()
    return dict(plan)


# --- per-sample gradients of one module call ---------------------------------------------


@dataclass(frozen=True)
class _LinearFactors:
    """A Linear call on [B, in] inputs: grad[b, o * R + r] = delta[b, o] * x[b, r], gathered
    pair by pair straight into the [B, k] feature block."""

    x: Tensor  # [B, R]
    delta: Tensor  # [B, O]

    def weight(self, flat_index: Tensor, out: Tensor) -> None:
        row_count = self.x.shape[1]
        out_idx, in_idx = flat_index // row_count, flat_index % row_count
        step = max(1, _GATHER_BUDGET // self.x.shape[0])
        for s in range(0, flat_index.numel(), step):
            torch.mul(
                self.delta.index_select(1, out_idx[s : s + step]),
                self.x.index_select(1, in_idx[s : s + step]),
                out=out[:, s : s + step],
            )

    def bias(self, index: Tensor, out: Tensor) -> None:
        out.copy_(self.delta.index_select(1, index))


@dataclass(frozen=True)
class _Factors:
    """A Linear/Conv2d call's per-sample weight gradient in factored form.

    grad[b, o * R + r] = sum_l delta[o, l, b] * rows(r)[l, b]: the output gradient times the
    input values that weight (o, r) multiplied, summed over positions l. The gather works
    batch-last (gathering a row copies one contiguous block), on the output channels and input
    rows that the selected pairs use only.
    """

    grad_out: Tensor  # [B, O, L], batch-first
    rows: Callable[[Tensor], Tensor]  # input-row indices [k] -> [k, L, B]
    row_count: int  # R
    # (samples, flat weight indices [k]) -> their [b, k] gradients, from the samples' whole
    # per-sample gradients: cheaper than the gather when many pairs are selected
    full: Callable[[slice, Tensor], Tensor] | None = None

    def weight(self, flat_index: Tensor, out: Tensor) -> None:
        """Write the [B, k] gradients of k flat weight indices into `out`."""
        batch, outputs, positions = self.grad_out.shape
        pairs = flat_index.numel()
        full_cost = outputs * self.row_count
        if self.full is not None and _GATHER_COST * pairs > full_cost:
            # a few samples at a time, so that their whole gradients are still in cache
            for s in range(0, batch, _FULL_SAMPLES):
                out[s : s + _FULL_SAMPLES] = self.full(slice(s, s + _FULL_SAMPLES), flat_index)
            return
        out_idx, in_idx = flat_index // self.row_count, flat_index % self.row_count
        delta, out_idx = self._batch_last(out_idx)
        step = max(1, _GATHER_BUDGET // (positions * batch))
        for s in range(0, pairs, step):
            product = delta.index_select(0, out_idx[s : s + step])
            product *= self.rows(in_idx[s : s + step])
            block = product.squeeze(1) if positions == 1 else product.sum(dim=1)
            out[:, s : s + step] = block.T

    def bias(self, index: Tensor, out: Tensor) -> None:
        delta, index = self._batch_last(index)
        out.copy_(torch.index_select(delta.sum(dim=1), 0, index).T)

    def _batch_last(self, out_idx: Tensor) -> tuple[Tensor, Tensor]:
        """The output gradient of the channels in `out_idx` as [O', L, B], and `out_idx`
        renumbered into it."""
        needed, renumbered = torch.unique(out_idx, return_inverse=True)
        if needed.numel() == self.grad_out.shape[1]:
            return _batch_last(self.grad_out), out_idx
        return _batch_last(self.grad_out.index_select(1, needed)), renumbered


def _batch_last(values: Tensor) -> Tensor:
    """[B, ...] -> [..., B], contiguous."""
    return values.permute(*range(1, values.ndim), 0).contiguous()


def _linear_factors(linear: nn.Linear, x: Tensor, delta: Tensor) -> _LinearFactors | _Factors:
    if x.ndim == 2:
        return _LinearFactors(x.contiguous(), delta.contiguous())
    batch = x.shape[0]
    act = _batch_last(x.reshape(batch, -1, linear.in_features).transpose(1, 2))
    grad_out = delta.reshape(batch, -1, linear.out_features).transpose(1, 2)
    return _Factors(grad_out, lambda r: act.index_select(0, r), linear.in_features)


def _conv_factors(conv: nn.Conv2d, x: Tensor, delta: Tensor) -> _Factors:
    """Rows gathered straight from the padded input: no im2col of the unselected rows."""
    pad_h, pad_w = conv.padding
    height, width = x.shape[2] + 2 * pad_h, x.shape[3] + 2 * pad_w
    (kh, kw), (dh, dw), (sh, sw) = conv.kernel_size, conv.dilation, conv.stride
    out_h, out_w = delta.shape[2], delta.shape[3]
    device = x.device
    # flat offset of the padded input that output position (h, w) reads at kernel tap (0, 0)
    positions = (
        torch.arange(out_h, device=device)[:, None] * (sh * width)
        + torch.arange(out_w, device=device) * sw
    ).flatten()

    @cache
    def padded() -> Tensor:  # [C * H * W, B], built when a gather first needs it
        values = x.new_zeros(x.shape[1], height, width, x.shape[0])
        values[:, pad_h : height - pad_h, pad_w : width - pad_w] = x.permute(1, 2, 3, 0)
        return values.view(-1, x.shape[0])

    def rows(r: Tensor) -> Tensor:
        channel, within = r // (kh * kw), r % (kh * kw)
        start = channel * (height * width) + (within // kw) * (dh * width) + (within % kw) * dw
        index = (start[:, None] + positions[None, :]).flatten()
        return padded().index_select(0, index).view(r.numel(), positions.numel(), x.shape[0])

    def full(part: slice, flat_index: Tensor) -> Tensor:
        """[b, k]: the samples' whole weight gradients, each sample's padded input correlated
        with its output gradient in one convolution grouped by sample (the conv's dilation
        becomes the stride and its stride the dilation), then the k flat indices taken."""
        inputs = F.pad(x[part], (pad_w, pad_w, pad_h, pad_h)).transpose(0, 1)  # [C, b, H, W]
        samples, outputs = inputs.shape[1], delta.shape[1]
        kernels = delta[part].reshape(samples * outputs, 1, out_h, out_w)
        whole = F.conv2d(inputs, kernels, stride=(dh, dw), dilation=(sh, sw), groups=samples)
        whole = whole[:, :, :kh, :kw].contiguous()  # [C, b * O, kh, kw]
        taps = kh * kw
        out_idx, within = flat_index // (x.shape[1] * taps), flat_index % (x.shape[1] * taps)
        channel, tap = within // taps, within % taps
        per_sample = channel * (samples * outputs * taps) + out_idx * taps + tap
        sample = torch.arange(samples, device=device)[:, None] * (outputs * taps)
        return whole.take(sample + per_sample)

    return _Factors(delta.flatten(2), rows, conv.in_channels * kh * kw, full)


def _factors(
    module: nn.Module, inputs: tuple[Any, ...], delta: Tensor
) -> _LinearFactors | _Factors | None:
    """The factored per-sample weight gradient of a Linear or plain Conv2d call, else None."""
    if not inputs or not isinstance(inputs[0], Tensor):
        return None
    x = inputs[0].detach()
    if type(module) is nn.Linear and x.ndim >= 2:
        return _linear_factors(module, x, delta)
    plain_conv = (
        type(module) is nn.Conv2d
        and module.groups == 1
        and module.padding_mode == "zeros"
        and not isinstance(module.padding, str)
    )
    if plain_conv and x.ndim == 4:
        return _conv_factors(module, x, delta)
    return None


def _write_factored(factors: _LinearFactors | _Factors, selection: _Selection, out: Tensor) -> None:
    if selection.local_name == "weight":
        factors.weight(selection.index, out)
    else:
        factors.bias(selection.index, out)


def _vmapped_gradients(
    module: nn.Module,
    inputs: tuple[Any, ...],
    kwargs: dict[str, Any],
    delta: Tensor,
    selections: list[_Selection],
) -> dict[str, Tensor]:
    """Per-sample gradients of <module(a_b), delta_b> w.r.t. the module's own parameters."""
    if not all(isinstance(item, Tensor) for item in inputs):
        raise RunError(
            f"eNTK features need tensor inputs to {type(module).__name__}, got non-tensor arguments"
        )
    params = {s.local_name: getattr(module, s.local_name).detach() for s in selections}

    def weighted_output(
        own: dict[str, Tensor], sample_inputs: tuple[Tensor, ...], sample_delta: Tensor
    ) -> Tensor:
        batched = tuple(item.unsqueeze(0) for item in sample_inputs)
        output = functional_call(module, own, batched, kwargs)
        return (output.squeeze(0) * sample_delta).sum()

    detached = tuple(item.detach() for item in inputs)
    per_sample = vmap(grad(weighted_output), in_dims=(None, 0, 0))(params, detached, delta)
    return {s.local_name: per_sample[s.local_name].flatten(1)[:, s.index] for s in selections}


# --- batched extraction -----------------------------------------------------------------


@dataclass
class _Call:
    module: nn.Module
    inputs: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: Tensor
    version: int


def _record_calls(
    model: nn.Module, modules: list[nn.Module], x: Tensor
) -> tuple[Tensor, list[_Call]]:
    """Forward pass that records every call of the given modules."""
    calls: list[_Call] = []

    def record(
        module: nn.Module, inputs: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        if not isinstance(output, Tensor):
            raise RunError(
                f"eNTK features need single-tensor module outputs; {type(module).__name__} returns "
                f"{type(output).__name__}"
            )
        calls.append(_Call(module, inputs, kwargs, output, output._version))

    handles = [module.register_forward_hook(record, with_kwargs=True) for module in modules]
    try:
        logits = model(x)
    finally:
        for handle in handles:
            handle.remove()
    if any(call.output._version != call.version for call in calls):
        raise RunError(
            "eNTK features need out-of-place activations; the model changes a layer output in place"
        )
    return logits, calls


def _features_of_chunk(
    model: nn.Module, plan: dict[nn.Module, list[_Selection]], x: Tensor, features: Tensor
) -> None:
    """Write the chunk's [B, p] features into `features`; every column is written, so the
    block needs no zero-fill."""
    with torch.enable_grad():
        logits, calls = _record_calls(model, list(plan), x)
        deltas = torch.autograd.grad(
            logits[:, 0].sum(), [call.output for call in calls], allow_unused=True
        )
    written: set[nn.Module] = set()  # a module called again adds to its first call's columns
    for call, delta in zip(calls, deltas, strict=True):
        if delta is not None:  # None: this call does not reach logit 0
            _write_call(call, delta, plan[call.module], features, call.module in written)
            written.add(call.module)
    for module in plan.keys() - written:  # no call of it reaches logit 0: zero gradient
        for selection in plan[module]:
            features[:, selection.columns] = 0


def _write_call(
    call: _Call, delta: Tensor, selections: list[_Selection], features: Tensor, add: bool
) -> None:
    """Write (or with `add`, add) one call's per-sample gradients into their feature columns."""
    factors = _factors(call.module, call.inputs, delta)
    grads = None
    if factors is None:
        grads = _vmapped_gradients(call.module, call.inputs, call.kwargs, delta, selections)
    for selection in selections:
        target = features[:, selection.columns]
        block = torch.empty_like(target) if add else target
        if grads is None:
            _write_factored(factors, selection, block)
        else:
            block.copy_(grads[selection.local_name])
        if add:
            target += block


def _extract(
    model: nn.Module, x: Tensor, coords: Tensor, chunk: int, into: Tensor | None = None
) -> Iterator[Tensor]:
    """Yield the features of x[i:i+chunk] for consecutive chunks, on the model's device:
    views of `into` ([N, p]) when given, else a fresh block per chunk."""
    if chunk <= 0:
        raise InputError(f"entk.batch_size must be a positive number of samples, got {chunk}")
    reference = _model_tensor(model)
    plan = _plan(model, coords)
    p = int(coords.numel())
    with _eval_mode(model):
        for start in range(0, x.shape[0], chunk):
            block = x[start : start + chunk].to(device=reference.device, dtype=reference.dtype)
            if into is None:
                features = torch.empty(len(block), p, dtype=reference.dtype, device=block.device)
            else:
                features = into[start : start + chunk]
            _features_of_chunk(model, plan, block, features)
            yield features


def iter_entk_chunks(model: nn.Module, x: Tensor, coords: Tensor, chunk: int) -> Iterator[Tensor]:
    """Yield the features of x[i:i+chunk] for consecutive chunks, each [rows, p] on the CPU.

    Peak memory is one chunk's activations plus its [rows, p] block (and, for parameterized
    layers other than Linear and Conv2d, their per-sample gradients); it does not grow with
    the number of samples. The model stays in eval mode until the iterator is exhausted.
    """
    for features in _extract(model, x, coords, chunk):
        yield features.cpu()


def entk_features(model: nn.Module, x: Tensor, coords: Tensor, batch_size: int = 64) -> Tensor:
    """[N, p] eNTK features of the N inputs, computed batched in chunks of `batch_size`."""
    reference = _model_tensor(model)
    features = torch.empty(
        x.shape[0], int(coords.numel()), dtype=reference.dtype, device=reference.device
    )
    for _ in _extract(model, x, coords, batch_size, into=features):
        pass
    return features.cpu()


def entk_features_loop(model: nn.Module, x: Tensor, coords: Tensor) -> Tensor:
    """The paper's reference (Algorithm 3): one forward and one backward pass per sample."""
    params = [param for param in model.parameters() if param.requires_grad]
    reference = _model_tensor(model)
    index = _check_coords(coords, sum(param.numel() for param in params)).to(reference.device)
    features = torch.empty(x.shape[0], index.numel(), dtype=reference.dtype)
    with _eval_mode(model), torch.enable_grad():
        for i in range(x.shape[0]):
            logit = model(x[i : i + 1].to(device=reference.device, dtype=reference.dtype))[0, 0]
            grads = torch.autograd.grad(logit, params, allow_unused=True)
            flat = torch.cat(
                [
                    (g if g is not None else torch.zeros_like(q)).flatten()
                    for g, q in zip(grads, params, strict=True)
                ]
            )
            features[i] = flat[index].cpu()
    return features


# --- normalization round -----------------------------------------------------------------


@dataclass
class FeatureMoments:
    """Streaming per-coordinate mean and (population) variance, accumulated in float64.

    Each client accumulates its own features block by block; the server merges the clients'
    moments (Chan et al.'s pairwise update) into the global mean/std used to standardize
    every client's and the test set's features.
    """

    count: int
    mean: Tensor
    m2: Tensor  # sum of squared deviations from `mean`

    @classmethod
    def empty(cls, dim: int) -> FeatureMoments:
        zeros = torch.zeros(dim, dtype=torch.float64)
        return cls(0, zeros, zeros.clone())

    @classmethod
    def of(cls, block: Tensor) -> FeatureMoments:
        if block.ndim != 2:
            raise InputError(f"feature block must be [samples, p], got shape {tuple(block.shape)}")
        values = block.detach().to(device="cpu", dtype=torch.float64)
        if values.shape[0] == 0:
            return cls.empty(values.shape[1])
        mean = values.mean(dim=0)
        return cls(values.shape[0], mean, ((values - mean) ** 2).sum(dim=0))

    def merge(self, other: FeatureMoments) -> FeatureMoments:
        """Moments of the union of both sample sets."""
        if self.mean.shape != other.mean.shape:
            raise InputError(
                f"cannot merge feature moments of widths {self.mean.numel()}, {other.mean.numel()}"
            )
        total = self.count + other.count
        if total == 0:
            return FeatureMoments(0, self.mean.clone(), self.m2.clone())
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.count / total)
        m2 = self.m2 + other.m2 + delta**2 * (self.count * other.count / total)
        return FeatureMoments(total, mean, m2)

    def update(self, block: Tensor) -> None:
        """Add a block of feature rows in place."""
        merged = self.merge(FeatureMoments.of(block))
        self.count, self.mean, self.m2 = merged.count, merged.mean, merged.m2

    def std(self, floor: float = 1e-6) -> Tensor:
        """Population standard deviation per coordinate, at least `floor` (constant columns)."""
        if self.count == 0:
            raise InputError("feature moments are empty: update them with at least one sample")
        return torch.sqrt(self.m2 / self.count).clamp_min(floor)

    def standardize(self, block: Tensor, floor: float = 1e-6) -> Tensor:
        """(block - mean) / std, in the block's dtype."""
        scaled = (block.detach().cpu().to(torch.float64) - self.mean) / self.std(floor)
        return scaled.to(block.dtype)
