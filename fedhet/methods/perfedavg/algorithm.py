"""Per-FedAvg (A. Fallah, A. Mokhtari, A. Ozdaglar, "Personalized Federated Learning with
Theoretical Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020), Algorithm 1.

The global model is trained for what one gradient step on a client's data makes of it: each
local step of client i, from w, on independent batches D, D', D'':

    w~ = w - alpha grad f_i(w; D)                      (the adaptation step)
    fo: w <- w - beta grad f_i(w~; D')                  (first order: MAML's Hessian dropped)
    hf: w <- w - beta (I - alpha H_i(w; D'')) grad f_i(w~; D')
        with H d = [grad f_i(w + delta d; D'') - grad f_i(w - delta d; D'')] / (2 delta)

(the Hessian-free variant's finite-difference Hessian-vector product); the
server averages as FedAvg. Client i's model is the global model adapted by one step of size
alpha on its data, and that is what it is evaluated with.

There is no official code. The pFedMe repository's Per-FedAvg (CharlieDinh/pFedMe,
FLAlgorithms/users/userperavg.py), the baseline of pFedMe's paper, runs the fo variant as above
(two batches per local step, the parameters restored before the outer step), with alpha = its
learning_rate (0.005 on MNIST) and beta = its beta (0.001). fedhet's choices, and why:
- beta is the round's lr (federation.lr and its schedule) and the outer step is the federation's
  local SGD (momentum reset each round, weight decay; both 0 by default, as the paper's plain
  steps); alpha is `algorithm.alpha`. A local step draws 2 (fo) or 3 (hf) batches of the
  client's seeded schedule, so `federation.local_steps` counts meta-steps.
- The evaluation's adaptation is the paper's: one SGD step of size alpha on one batch of the
  client's training data (of federation.batch_size, drawn from the spec's seed and the client's
  id: the same batch at every evaluation, in training and in `fedhet eval`). The pFedMe
  repository's `train_one_step` takes two steps (alpha, then beta) on batches of the client's
  test data, which fedhet never trains on.
- BatchNorm statistics are updated by every forward pass of a step (the hf variant's included).

Clients keep no state across rounds; a client never sampled is evaluated the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.plugin import (
    ClientJob,
    ClientResult,
    Divergence,
    LocalStats,
    Tensors,
    Trainer,
    sgd,
    tensors,
    torch_generator,
)

Batch = tuple[torch.Tensor, torch.Tensor]
Loss = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
BATCHES = {"fo": 2, "hf": 3}  # batches a local step draws


def cross_entropy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def gradients(model: nn.Module, loss: Loss, batch: Batch) -> tuple[list[torch.Tensor], float]:
    """The gradient of `loss` on `batch` at the model's parameters, and the loss."""
    value = loss(model, *batch)
    return list(torch.autograd.grad(value, list(model.parameters()))), float(value.detach())


@torch.no_grad()
def _shift(model: nn.Module, by: list[torch.Tensor], scale: float) -> None:
    for p, d in zip(model.parameters(), by, strict=True):
        p.add_(d, alpha=scale)


def meta_gradient(
    model: nn.Module, batches: list[Batch], alpha: float, delta: float, loss: Loss = cross_entropy
) -> tuple[list[torch.Tensor], float]:
    """Per-FedAvg's direction at the model's parameters w (left as they were): fo with two
    batches, grad f(w - alpha grad f(w; D); D'); hf with three, that minus alpha H(w; D'') times
    it. Also the adaptation batch's loss at w."""
    start = [p.detach().clone() for p in model.parameters()]
    adapt, at_w = gradients(model, loss, batches[0])
    _shift(model, adapt, -alpha)
    direction, _ = gradients(model, loss, batches[1])
    _restore(model, start)
    if len(batches) == 3:
        _shift(model, direction, delta)
        plus, _ = gradients(model, loss, batches[2])
        _shift(model, direction, -2 * delta)
        minus, _ = gradients(model, loss, batches[2])
        _restore(model, start)
        direction = [
            d - alpha * (gp - gm) / (2 * delta)
            for d, gp, gm in zip(direction, plus, minus, strict=True)
        ]
    return direction, at_w


@torch.no_grad()
def _restore(model: nn.Module, values: list[torch.Tensor]) -> None:
    for p, v in zip(model.parameters(), values, strict=True):
        p.copy_(v)


class PerFedAvg(Trainer):
    vectorizable = False  # a local step is a meta-step over several batches

    def local_steps(self, job: ClientJob) -> int:
        return job.steps * BATCHES[self.config.variant]  # batches drawn: k per meta-step

    def client_update(self, job: ClientJob) -> ClientResult:
        """Per-FedAvg's own loop: a local step is a meta-step over several batches (a look-ahead
        step, then the outer gradient at the look-ahead point), which the engine's step of one
        batch and one loss cannot state."""
        model, per_step = job.model, BATCHES[self.config.variant]
        model.train()
        optimizer = sgd(model, job.sgd)
        losses = []
        for step, batches in enumerate(_grouped(self.client_batches(job), per_step)):
            rows = [job.client.rows(idx) for idx in batches]
            direction, loss = meta_gradient(model, rows, self.config.alpha, self.config.delta)
            if not math.isfinite(loss):
                raise Divergence(step, loss)
            optimizer.zero_grad(set_to_none=True)
            for p, d in zip(model.parameters(), direction, strict=True):
                p.grad = d
            optimizer.step()
            losses.append(loss)
        first = losses[0] if losses else math.nan
        stats = LocalStats(len(losses), sum(losses) / max(len(losses), 1), first_loss=first)
        return ClientResult(job.client.id, tensors.clone(model.state_dict()), job.client.n, stats)

    def evaluation_states(
        self, global_state: Tensors, client_states: dict[int, Tensors]
    ) -> list[Tensors]:
        """Each given client's adapted model, in client order."""
        if not client_states:
            return [global_state]
        model = self.build_model().to(self.setup.device)
        return [self.adapted(model, global_state, c) for c in sorted(client_states)]

    def adapted(self, model: nn.Module, global_state: Tensors, client: int) -> Tensors:
        """The global model after one SGD step of size alpha on a seeded batch of the client's
        training data (unchanged for a client without samples)."""
        data = self.setup.clients[client]
        if not data.n:
            return global_state
        model.load_state_dict(global_state)
        model.train()
        generator = torch_generator(self.setup.spec.seed, "perfedavg-adapt", client)
        idx = torch.randperm(data.n, generator=generator)[: self.fed.batch_size]
        grads, _ = gradients(model, cross_entropy, data.rows(idx))
        _shift(model, grads, -self.config.alpha)
        return tensors.clone(model.state_dict())


def _grouped(batches: Iterator[torch.Tensor], size: int) -> Iterator[list[torch.Tensor]]:
    """The schedule's batches, `size` at a time."""
    group: list[torch.Tensor] = []
    for idx in batches:
        group.append(idx)
        if len(group) == size:
            yield group
            group = []
