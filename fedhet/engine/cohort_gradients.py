"""The gradients of a cohort of clients at one local step, each client's of its own loss.

A chain of Linear, ReLU and Flatten layers (the MLP) runs as batched matmuls over the client
dim with stacked leaf tensors, and one backward of the sum of the clients' losses gives each
client its own gradient (client i's loss depends only on its weights); any other model runs
`vmap(grad_and_value(functional_call))` over the clients. `cohort_gradients` picks the way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from fedhet.engine.client_step import ClientStep
from fedhet.engine.tensors import Tensors


@dataclass
class CohortBatch:
    """The active clients' batches at one step: inputs x [clients, batch, ...], labels and
    mask (1: a real sample, 0: padding) [clients, batch], real samples per client [clients],
    and the stacked extras the client step's loss term reads."""

    x: Tensor
    y: Tensor
    mask: Tensor
    count: Tensor
    extras: Tensors


class Gradients:
    """How a cohort's gradients are computed for one kind of model."""

    def layout(self, name: str, stacked: Tensor) -> Tensor:
        """A copy of the stacked parameter (or tensor alike) `name` in the memory layout the
        gradients come in, so that the update runs over both in memory order."""
        return stacked.clone()

    def __call__(self, params: Tensors, batch: CohortBatch) -> tuple[Tensors, Tensor]:
        """(stacked gradients, each client's loss) of the active clients' stacked `params` on
        their `batch`."""
        raise NotImplementedError


def cohort_gradients(
    model: nn.Module, start: Tensors, sample: Tensor, step: ClientStep
) -> Gradients:
    """The fastest exact way to compute a cohort's gradients for `model` (`sample`: one input):
    stacked matmuls for a chain of Linear, ReLU and Flatten layers, vmap otherwise."""
    layers = linear_chain(model, sample)
    if layers is not None:
        return StackedGradients(model, layers, step)
    buffers = {n: start[n] for n, _ in model.named_buffers()}
    return VmapGradients(model, buffers, step)


def linear_chain(model: nn.Module, sample: Tensor) -> list[nn.Module] | None:
    """`model`'s layers in forward order when it is a chain of Linear, ReLU and Flatten (from
    dim 1) layers, each taking the previous one's output, that holds all its parameters;
    None for any other model. Found by running `sample` and recording the calls."""
    leaves = [m for m in model.modules() if not any(m.children())]
    if not all(_stackable(m) for m in leaves):
        return None
    calls: list[tuple[nn.Module, tuple, object]] = []
    handles = [
        m.register_forward_hook(lambda m, inputs, output: calls.append((m, inputs, output)))
        for m in leaves
    ]
    try:
        with torch.no_grad():
            previous = sample.unsqueeze(0)
            output = model(previous)
    finally:
        for handle in handles:
            handle.remove()
    for _, inputs, out in calls:
        if len(inputs) != 1 or inputs[0] is not previous:
            return None
        previous = out
    layers = [module for module, _, _ in calls]
    held = {id(p) for m in layers for p in m.parameters()}
    if output is not previous or any(id(p) not in held for p in model.parameters()):
        return None
    return layers


def _stackable(module: nn.Module) -> bool:
    if isinstance(module, nn.Flatten):
        return module.start_dim == 1 and module.end_dim == -1
    return type(module) in (nn.Linear, nn.ReLU)


class StackedGradients(Gradients):
    """A chain of Linear, ReLU and Flatten layers on stacked parameters: each Linear is a
    batched matmul over the client dim, and one backward of the sum of the clients' losses
    gives every client the gradient of its own loss."""

    def __init__(self, model: nn.Module, layers: list[nn.Module], step: ClientStep):
        names = {id(p): n for n, p in model.named_parameters()}
        self.layers = [
            (
                type(m),
                names.get(id(getattr(m, "weight", None))),
                names.get(id(getattr(m, "bias", None))),
            )
            for m in layers
        ]
        self.step = step
        self.weights = {weight for kind, weight, _ in self.layers if kind is nn.Linear}

    def layout(self, name: str, stacked: Tensor) -> Tensor:
        """Linear weights [clients, out, in] as views of [clients, in, out] tensors: the
        layout in which the batched matmuls read them and write their gradients fastest."""
        if name in self.weights:
            return stacked.transpose(1, 2).contiguous().transpose(1, 2)
        return super().layout(name, stacked)

    def __call__(self, params: Tensors, batch: CohortBatch) -> tuple[Tensors, Tensor]:
        leaves = {n: p.detach().requires_grad_() for n, p in params.items()}
        h = batch.x
        for kind, weight, bias in self.layers:
            if kind is nn.Flatten:
                h = h.flatten(2)
            elif kind is nn.ReLU:
                h = torch.relu(h)
            elif bias is None:
                h = torch.bmm(h, leaves[weight].transpose(1, 2))
            else:
                h = torch.baddbmm(leaves[bias].unsqueeze(1), h, leaves[weight].transpose(1, 2))
        y = batch.y
        losses = F.cross_entropy(h.flatten(0, 1), y.flatten(), reduction="none").view_as(y)
        loss = (losses * batch.mask).sum(1) / batch.count
        term = self.step.client_loss(leaves, batch.extras)
        if term is not None:
            loss = loss + term
        grads = torch.autograd.grad(loss.sum(), list(leaves.values()))
        return dict(zip(leaves, grads, strict=True)), loss.detach()


class VmapGradients(Gradients):
    """Any model: `vmap(grad_and_value(...))` of one client's loss via `functional_call`."""

    def __init__(self, model: nn.Module, buffers: Tensors, step: ClientStep):
        self.model, self.buffers, self.step = model, buffers, step
        self.vmapped = vmap(grad_and_value(self._loss))

    def __call__(self, params: Tensors, batch: CohortBatch) -> tuple[Tensors, Tensor]:
        return self.vmapped(params, batch.x, batch.y, batch.mask, batch.count, batch.extras)

    def _loss(
        self, params: Tensors, x: Tensor, y: Tensor, mask: Tensor, count: Tensor, extras: Tensors
    ) -> Tensor:
        logits = functional_call(self.model, (params, self.buffers), (x,))
        losses = F.cross_entropy(logits, y, reduction="none")
        loss = (losses * mask).sum() / count
        term = self.step.client_loss(  # a cohort of one
            {n: p.unsqueeze(0) for n, p in params.items()},
            {n: e.unsqueeze(0) for n, e in extras.items()},
        )
        return loss if term is None else (loss + term).sum()
