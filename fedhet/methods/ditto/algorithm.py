"""Ditto (Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021), Algorithm 1.

The global model w trains as FedAvg's. Each client k also keeps a personal model v_k, trained
on its own data with the proximal term lambda/2 ||v_k - w||^2 towards the round's global model:

    v_k <- v_k - lr (grad f_k(v_k; batch) + lambda (v_k - w))

and v_k is the client's model: each client is evaluated with its own v_k.

The official code (litian96/ditto, flearn/trainers_MTL/ditto.py) does, for each of a sampled
client's local iterations, one step of v_k and one step of the client's copy of w on the same
batch (v_k first, with the same learning rate), anchored at the round's global model; every
client's v_k starts as a copy of the initial model, and the evaluation scores every client's
v_k. fedhet does the same: each local step's batch first takes v_k's step (in `local_loss`, at
the start of the step), then w's, so w's local training is FedAvg's bit for bit (nothing of v_k
reaches w or the batch draws), and with lambda = 0 each v_k is the model `local` trains for that
client, bit for bit.

Where fedhet differs, and why:
- Both steps use the federation's local SGD (`federation.momentum`, reset every round, and
  `federation.weight_decay`), as every fedhet method; the official code's steps are plain SGD
  (momentum 0, no weight decay: fedhet's defaults). `personal_lr` gives v_k a step size of its
  own (decayed as federation.lr; the limit below needs it); by default it is the round's lr,
  as in the official code. The official `dynamic_lam` (lambda picked per step on validation data)
  and its robustness experiments (corrupted clients, robust aggregators) are not offered.
- The global model is FedAvg's: clients drawn uniformly, their models averaged weighted by
  size. The official server can draw clients in proportion to their sizes (`sampling` 2) and
  averages their updates uniformly: an unbiased estimate of the same size-weighted average.
- The paper's Algorithm 1 runs s personal steps per round, a count of their own; the official
  code runs one per local iteration (s = the local steps), which fedhet follows.
- lambda -> infinity pulls v_k onto the round's global model: with personal_lr * lambda = 1 each
  step sets v_k = w - personal_lr * grad f_k(v_k), at distance personal_lr * |grad| from w
  (tests/test_pfl_personal.py); a step size over 2 / lambda diverges, as explicit SGD on the
  proximal term does.

A client keeps v_k (its state and buffers) in its client state, so it is checkpointed, resumed
and extended with the run; one that never trained is scored with the initial model.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.plugin import (
    ClientJob,
    ClientResult,
    Divergence,
    Tensors,
    Trainer,
    sgd,
    tensors,
)

PERSONAL = "personal."  # + a model state name: the client's personal model v_k


@dataclass
class PersonalModel:
    """A client's v_k during a round: one step per local step, towards the round's `anchor`."""

    model: nn.Module
    optimizer: torch.optim.SGD
    anchor: dict[str, torch.Tensor]  # the round's global parameters
    lam: float
    steps: int = 0

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(x), y)
        if self.lam:
            prox = sum(((p - self.anchor[n]) ** 2).sum() for n, p in self.model.named_parameters())
            loss = loss + 0.5 * self.lam * prox
        value = float(loss.detach())
        if not math.isfinite(value):
            raise Divergence(self.steps, value)
        loss.backward()
        self.optimizer.step()
        self.steps += 1

    def state(self) -> Tensors:
        return {PERSONAL + n: v for n, v in tensors.clone(self.model.state_dict()).items()}


class Ditto(Trainer):
    vectorizable = False  # each client's v_k trains beside its copy of w

    @cached_property
    def initial_model(self) -> Tensors:
        """Every v_k before its client's first round: the initial model (as the official code)."""
        return tensors.clone(self.build_model().to(self.setup.device).state_dict())

    def personal(self, client_state: Tensors) -> Tensors:
        """The client's v_k, as a model state."""
        own = {n[len(PERSONAL) :]: v for n, v in client_state.items() if n.startswith(PERSONAL)}
        return own or self.initial_model

    def client_context(self, job: ClientJob) -> PersonalModel:
        model = copy.deepcopy(job.model)
        model.load_state_dict(self.personal(job.client_state))
        settings = job.sgd
        if self.config.personal_lr is not None:
            settings = replace(settings, lr=self.personal_rate(settings.lr))
        optimizer = sgd(model, settings)
        anchor = {n: v for n, v in job.global_state.items() if n in self.param_names}
        return PersonalModel(model, optimizer, anchor, self.config.lam)

    def personal_rate(self, round_lr: float) -> float:
        """`personal_lr`, decayed by the round's schedule as federation.lr is."""
        return self.config.personal_lr * round_lr / self.fed.lr

    def local_loss(
        self, job: ClientJob, model: nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        job.context.step(x, y)  # v_k's step on this batch, before w's (as the official code)
        return super().local_loss(job, model, x, y)

    def client_update(self, job: ClientJob) -> ClientResult:
        """The engine's loop, then the client keeps its v_k, which `local_loss` trained beside
        w on the job's context: a client step's `finish` sees only w's state (why this trainer
        overrides `client_update`)."""
        result = super().client_update(job)
        job.client_state.update(job.context.state())
        return result

    def evaluation_states(
        self, global_state: Tensors, client_states: dict[int, Tensors]
    ) -> list[Tensors]:
        """Each given client's v_k, in client order (the initial model for one never trained)."""
        return [self.personal(client_states[c]) for c in sorted(client_states)] or [global_state]
