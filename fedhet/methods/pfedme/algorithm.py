"""pFedMe (C. T. Dinh, N. H. Tran, T. D. Nguyen, "Personalized Federated Learning with Moreau
Envelopes", NeurIPS 2020), Algorithm 1.

Each client i minimizes the Moreau envelope of its loss, F_i(w) = min_theta f_i(theta) +
lambda/2 ||theta - w||^2. A local step on a batch first solves the inner problem approximately,

    K times: theta <- theta - personal_lr (grad f_i(theta; batch) + lambda (theta - w))

(theta warm-started from the previous step's solution, from w at the round's start), then moves
the client's local model towards it: w <- w - lr lambda (w - theta). The server mixes the average
of the local w's with the previous global model: w <- (1 - beta) w_prev + beta average; beta = 1
is FedAvg's averaging. Each client is evaluated with its personalized theta.

The official code (CharlieDinh/pFedMe: FLAlgorithms/users/userpFedMe.py, pFedMeOptimizer,
servers/serverbase.py `persionalized_aggregate_parameters`) does the same, the K inner steps on
one batch, theta kept in the model the inner optimizer steps. fedhet's defaults are its main.py's
(the README's MNIST DNN run): lambda 15, K 5, personal_learning_rate 0.09, beta 1, and its
learning_rate 0.005 is the spec's federation.lr (its README also runs beta 2, and
personal_learning_rate 0.1 for MNIST logistic regression).

Where fedhet differs, and why:
- The official server trains every client each round and aggregates a sampled subset; fedhet
  trains the sampled clients only (as for every method: what one round costs is the same for
  all of them), so a client's theta is the one from its last round.
- The official inner step adds mu * theta (mu = 0.001, an L2 term); here that term is
  `federation.weight_decay` (0 by default). Momentum is refused: the paper's steps are plain
  gradient steps.
- BatchNorm statistics are not parameters: theta's (updated by the inner steps' forward passes)
  are uploaded with the local w, and are theta's own in the client's personalized model.

A client keeps theta in its client state, so it is checkpointed, resumed and extended with the
run; one that never trained is scored with the global model (theta = w before any inner step).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.plugin import (
    ClientJob,
    ClientResult,
    Divergence,
    LocalStats,
    PersonalModels,
    Tensors,
    stored,
    tensors,
    to_store,
)

THETA = "theta."  # + a model state name: the client's personalized model


def solve_inner(
    model: nn.Module,
    anchor: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    lr: float,
    lam: float,
    weight_decay: float = 0.0,
) -> float:
    """K gradient steps on f(theta; x, y) + lam/2 ||theta - anchor||^2 (+ weight_decay/2
    ||theta||^2), theta being `model`'s parameters, in place; the first step's data loss."""
    first = math.nan
    for k in range(steps):
        model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        first = float(loss.detach()) if k == 0 else first
        with torch.no_grad():
            for name, theta in model.named_parameters():
                grad = theta.grad + lam * (theta - anchor[name]) + weight_decay * theta
                theta.sub_(lr * grad)
    return first


class PFedMe(PersonalModels):
    """Each client's steps solve an inner problem of its own, whose solution theta it keeps."""

    vectorizable = False  # a local step is an inner optimization (see client_update)

    def client_update(self, job: ClientJob) -> ClientResult:
        """The client's local rounds: theta (job.model, which starts at the global model) solves
        each step's inner problem, and the client's w moves towards it: an inner optimization
        per step, which the engine's one gradient step per batch cannot state."""
        config, theta = self.config, job.model
        theta.train()
        local = {n: p.detach().clone() for n, p in theta.named_parameters()}  # the client's w
        losses = []
        for step, idx in enumerate(self.client_batches(job)):
            x, y = job.client.rows(idx)
            loss = solve_inner(
                theta,
                local,
                x,
                y,
                config.inner_steps,
                config.personal_lr,
                config.lam,
                job.sgd.weight_decay,
            )
            if not math.isfinite(loss):
                raise Divergence(step, loss)
            losses.append(loss)
            with torch.no_grad():
                for name, p in theta.named_parameters():
                    local[name].sub_(job.sgd.lr * config.lam * (local[name] - p))
        personalized = tensors.clone(theta.state_dict())
        job.client_state.update(to_store(personalized, THETA))
        first = losses[0] if losses else math.nan
        stats = LocalStats(len(losses), sum(losses) / max(len(losses), 1), first_loss=first)
        return ClientResult(job.client.id, {**personalized, **local}, job.client.n, stats)

    def aggregate(self, round, global_state, server_state, results, weights) -> Tensors:
        """(1 - beta) previous global + beta * the clients' weighted average."""
        averaged = super().aggregate(round, global_state, server_state, results, weights)
        beta = self.config.beta
        if beta == 1:
            return averaged
        return {
            n: (1 - beta) * global_state[n] + beta * v if v.is_floating_point() else v
            for n, v in averaged.items()
        }

    def personalized(self, global_state: Tensors, client_state: Tensors) -> Tensors:
        """The client's theta (the global model for one never trained)."""
        return stored(client_state, THETA) or global_state
