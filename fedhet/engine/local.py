"""Batch schedules and the local SGD loop every algorithm shares."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from fedhet.data.clients import ClientData

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
GradHook = Callable[[nn.Module], None]


def batch_schedule(
    n: int, batch_size: int, steps: int, gen: torch.Generator
) -> Iterator[torch.Tensor]:
    """`steps` index batches: successive seeded permutations cut into batches.

    The last batch of each permutation may be short. A client without samples has no batch
    to draw: n=0 raises ValueError (the engine never samples such a client, see
    `TrainSetup.holders`) instead of looping forever.
    """
    if n < 1:
        raise ValueError(f"batch_schedule: a client with n={n} samples has no batch to draw")
    done = 0
    while done < steps:
        perm = torch.randperm(n, generator=gen)
        for start in range(0, n, batch_size):
            yield perm[start : start + batch_size]
            done += 1
            if done == steps:
                return


class Divergence(Exception):
    def __init__(self, step: int, loss: float):
        super().__init__(f"loss became {loss} at local step {step}")
        self.step = step


@dataclass
class LocalStats:
    steps: int
    mean_loss: float
    carried: float = 0.0  # gradient weight of the momentum buffer the round started from
    first_loss: float = math.nan  # the first step's loss: the round's global model on a batch


def effective_steps(steps: int, momentum: float, carried: float = 0.0) -> float:
    """a = sum_{k<steps} (1 - rho^(k+1)) / (1 - rho): the local displacement of SGD with
    momentum rho, in units of lr times a gradient (a weighted sum of the step's gradients whose
    weights total a); `steps` without momentum. A round that starts from a kept buffer whose
    gradients weigh `carried` in total (`buffer_weight`) moves by carried * rho^(k+1) more at
    step k."""
    if momentum == 0:
        return float(steps)
    return sum(
        (1 - momentum ** (k + 1)) / (1 - momentum) + carried * momentum ** (k + 1)
        for k in range(steps)
    )


def buffer_weight(steps: int, momentum: float, carried: float) -> float:
    """The total weight of the gradients in a momentum buffer after `steps` steps from a buffer
    of weight `carried` (0: empty): w <- rho w + 1 per step."""
    return momentum**steps * carried + (1 - momentum**steps) / (1 - momentum)


@dataclass(frozen=True)
class SGDSettings:
    """torch.optim.SGD's settings (no dampening, no Nesterov): a client's local optimizer, on
    its job (`ClientJob.sgd`), which every executor reads."""

    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0


def sgd(model: nn.Module, settings: SGDSettings) -> torch.optim.SGD:
    """torch's SGD over `model`'s parameters with `settings`."""
    return torch.optim.SGD(
        model.parameters(),
        lr=settings.lr,
        momentum=settings.momentum,
        weight_decay=settings.weight_decay,
    )


def local_sgd(
    model: nn.Module,
    client: ClientData,
    batches: Iterator[torch.Tensor],
    optimizer: torch.optim.Optimizer,
    loss_fn: LossFn,
    before_step: GradHook,
    after_step: GradHook,
    first_step: Callable[[nn.Module], torch.Tensor] | None = None,
) -> LocalStats:
    """Run SGD over `batches` of the client's data.

    `before_step` may rewrite gradients before each optimizer step, `after_step` the parameters
    after it (a client step's corrections, fedhet.engine.client_step.OneClient); `first_step`,
    when given, replaces the first step's forward/backward (FedTAN's synchronized step): it
    must set the gradients and return the loss.
    """
    model.train()
    total, steps, first = 0.0, 0, math.nan
    for step, idx in enumerate(batches):
        optimizer.zero_grad(set_to_none=True)
        if step == 0 and first_step is not None:
            loss = first_step(model)
        else:
            loss = loss_fn(model, *client.rows(idx))
            loss.backward()
        value = float(loss.detach())
        if not math.isfinite(value):
            raise Divergence(step, value)
        before_step(model)
        optimizer.step()
        after_step(model)
        total += value
        first = value if steps == 0 else first
        steps += 1
    return LocalStats(steps, total / max(steps, 1), first_loss=first)
