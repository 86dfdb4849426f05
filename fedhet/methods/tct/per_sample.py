"""Per-sample gradients of one module call, written into the eNTK feature columns they fill.

Given a call's input a_b and output gradient delta_b for every sample b of a chunk, a Linear or
plain Conv2d call yields just the selected weight coordinates (sum over positions of
delta[o] * a[r]), gathered pair by pair, except where so many of a convolution's weights are
kept that its whole per-sample gradient (one convolution grouped by sample) is cheaper than the
gather; any other module with parameters (norm layers, custom modules) gets torch.func's
vmap(grad) of its own functional_call. fedhet.methods.tct.entk runs the passes that give a_b and
delta_b.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from fedhet.plugin import RunError

# Elements in one temporary product block of the Linear/Conv2d coordinate gather: 1 MiB of
# float32, so the block is still in the L2 cache when it is multiplied and summed (a 16 MiB
# block made the simple_cnn gather 1.5-3x slower).
_GATHER_BUDGET = 1 << 18
# Measured on one CPU thread (float32): a gathered multiply-add costs about as much as 25
# multiply-adds of the grouped convolution that gives a convolution's whole per-sample gradient.
_GATHER_COST = 25
# Samples per block of a convolution's whole per-sample gradient, which bounds its memory.
_FULL_SAMPLES = 32


@dataclass(frozen=True)
class Selection:
    """The selected coordinates inside one parameter and the feature columns they fill."""

    local_name: str  # the parameter's name inside its owning module
    index: Tensor  # flat indices into the parameter
    columns: slice  # where these coordinates go in the [N, p] feature matrix


@dataclass
class ModuleCall:
    """One call of a module in a forward pass: its arguments, and its output as recorded
    (`version`: the output's version then, to tell an output changed in place later)."""

    module: nn.Module
    inputs: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: Tensor
    version: int


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


def _write_factored(factors: _LinearFactors | _Factors, selection: Selection, out: Tensor) -> None:
    if selection.local_name == "weight":
        factors.weight(selection.index, out)
    else:
        factors.bias(selection.index, out)


def _vmapped_gradients(
    call: ModuleCall, delta: Tensor, selections: list[Selection]
) -> dict[str, Tensor]:
    """Per-sample gradients of <module(a_b), delta_b> w.r.t. the module's own parameters."""
    module, inputs, kwargs = call.module, call.inputs, call.kwargs
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


def write_call_gradients(
    call: ModuleCall, delta: Tensor, selections: list[Selection], features: Tensor, add: bool
) -> None:
    """Write (or with `add`, add) one call's per-sample gradients (`delta`: its output
    gradient) into their feature columns."""
    factors = _factors(call.module, call.inputs, delta)
    grads = None
    if factors is None:
        grads = _vmapped_gradients(call, delta, selections)
    for selection in selections:
        target = features[:, selection.columns]
        block = torch.empty_like(target) if add else target
        if grads is None:
            _write_factored(factors, selection, block)
        else:
            block.copy_(grads[selection.local_name])
        if add:
            target += block
