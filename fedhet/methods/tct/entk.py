"""TCT's convexification: empirical-NTK features of a bootstrapped model.

phi(x) = d f_1(x; theta_0) / d theta, the gradient of the FIRST output logit with respect to
every trainable parameter (in `model.parameters()` order, flattened and concatenated), where
theta_0 is the stage-1 model with its head re-initialized. Only `p` coordinates of phi are
kept, chosen once by a seeded mask that every client and the test set share.

Features are computed in eval mode (BatchNorm uses its running statistics), so a sample's
feature does not depend on which other samples share its batch. That independence is what
makes the batched computation exact: one forward and one backward pass of sum_b f_1(x_b)
give, at every module, the sample's input a_b and output gradient delta_b, and a module's
per-sample parameter gradient depends only on (a_b, delta_b): fedhet.methods.tct.per_sample
computes just the selected coordinates from them, written straight into the chunk's [B, p]
block. The features' normalization round is fedhet.methods.tct.moments.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from fedhet.methods.tct.per_sample import ModuleCall, Selection, write_call_gradients
from fedhet.plugin import InputError, RunError


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


def _plan(model: nn.Module, coords: Tensor) -> dict[nn.Module, list[Selection]]:
    """Owning module -> its selected parameters, from the global coordinate mask."""
    owners: dict[int, tuple[nn.Module, str]] = {}
    for _, module in model.named_modules():
        for local_name, param in module.named_parameters(recurse=False):
            if id(param) in owners:
                raise RunError("eNTK features do not support a parameter shared between modules")
            owners[id(param)] = (module, local_name)
    trainable = [param for param in model.parameters() if param.requires_grad]
    coords = _check_coords(coords, sum(param.numel() for param in trainable))
    plan: dict[nn.Module, list[Selection]] = defaultdict(list)
    offset, column = 0, 0
    for param in trainable:
        inside = coords[(coords >= offset) & (coords < offset + param.numel())] - offset
        if inside.numel():
            module, local_name = owners[id(param)]
            columns = slice(column, column + inside.numel())
            plan[module].append(Selection(local_name, inside.to(param.device), columns))
            column += inside.numel()
        offset += param.numel()
    return dict(plan)


# --- batched extraction -----------------------------------------------------------------


def _record_calls(
    model: nn.Module, modules: list[nn.Module], x: Tensor
) -> tuple[Tensor, list[ModuleCall]]:
    """Forward pass that records every call of the given modules."""
    calls: list[ModuleCall] = []

    def record(
        module: nn.Module, inputs: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        if not isinstance(output, Tensor):
            raise RunError(
                f"eNTK features need single-tensor module outputs; {type(module).__name__} returns "
                f"{type(output).__name__}"
            )
        calls.append(ModuleCall(module, inputs, kwargs, output, output._version))

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
    model: nn.Module, plan: dict[nn.Module, list[Selection]], x: Tensor, features: Tensor
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
            add = call.module in written
            write_call_gradients(call, delta, plan[call.module], features, add)
            written.add(call.module)
    for module in plan.keys() - written:  # no call of it reaches logit 0: zero gradient
        for selection in plan[module]:
            features[:, selection.columns] = 0


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
