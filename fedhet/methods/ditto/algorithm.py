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

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.plugin import ClientJob, OwnModel, Tensors, TrainedBeside, stored

PERSONAL = "personal."  # + a model state name: the client's personal model v_k


class PersonalModel(OwnModel):
    """A client's v_k during a round: one step per local step, towards the round's `anchor`."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.SGD, anchor: Tensors, lam: float):
        super().__init__(model, optimizer, PERSONAL)
        self.anchor, self.lam = anchor, lam  # anchor: the round's global parameters

    def loss(self, w: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(self.model(x), y)
        if self.lam:
            prox = sum(((p - self.anchor[n]) ** 2).sum() for n, p in self.model.named_parameters())
            loss = loss + 0.5 * self.lam * prox
        return loss


class Ditto(TrainedBeside):
    """Each client's v_k trains beside its copy of w, v_k's step on each batch before w's (as
    the official code)."""

    def client_context(self, job: ClientJob) -> PersonalModel:
        settings = job.sgd
        if self.config.personal_lr is not None:
            settings = replace(settings, lr=self.personal_rate(settings.lr))
        model, optimizer = self.own_copy(
            job, self.personalized(job.global_state, job.client_state), settings
        )
        anchor = {n: v for n, v in job.global_state.items() if n in self.param_names}
        return PersonalModel(model, optimizer, anchor, self.config.lam)

    def personal_rate(self, round_lr: float) -> float:
        """`personal_lr`, decayed by the round's schedule as federation.lr is."""
        return self.config.personal_lr * round_lr / self.fed.lr

    def personalized(self, global_state: Tensors, client_state: Tensors) -> Tensors:
        """The client's v_k (the initial model, as the official code, before its first round)."""
        return stored(client_state, PERSONAL) or self.initial_model
