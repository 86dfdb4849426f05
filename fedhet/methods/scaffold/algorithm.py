"""SCAFFOLD (Karimireddy et al.), option II control variates, in two forms (`correction`).

- `gradient` (default): the correction c - c_i is added to every gradient before the
  optimizer step, and c_i+ = c_i - c + (x - y_i) / (a_i lr) with a_i the number of local steps
  for plain SGD, or FedNova's effective step count under momentum (momentum scales the
  displacement by up to 1 / (1 - rho); dividing by the step count alone would inflate c_i by
  that factor and over-correct).
- `after_step`: the authors' code that VHL's and FedImpro's papers ran their baselines with
  (NIID-Bench's form): after each optimizer step, param -= lr (c - c_i), so momentum never
  sees the correction, and c_i+ = c_i - c + (x - y_i) / (K lr) with K the local step count.

Invariant kept by `aggregate`: the server control c equals sum_i p_i c_i over ALL clients
(p_i = n_i / n), so under full participation the corrections c_i - c sum (p-weighted) to zero.
"""

from typing import Literal

import torch

from fedhet.plugin import (
    ClientStep,
    LocalStats,
    SGDSettings,
    Stacked,
    Tensors,
    Trainer,
    effective_steps,
    tensors,
)


class Controlled(ClientStep):
    """A client's steps corrected by c - c_i (its extras), and its new control once trained."""

    def __init__(
        self,
        correction: Literal["gradient", "after_step"],
        server_control: Tensors,
        global_state: Tensors,
    ):
        self.correction = correction
        self.c, self.global_state = server_control, global_state

    def control(self, client_state: Tensors) -> Tensors:
        """c_i: the client's control variate (0 before its first round)."""
        return {
            n: client_state[n] if n in client_state else torch.zeros_like(c)
            for n, c in self.c.items()
        }

    def extras(self, client_state: Tensors) -> Tensors:
        c_i = self.control(client_state)
        return {n: c - c_i[n] for n, c in self.c.items()}

    def correct(self, grads: Stacked, extras: Stacked, params: Stacked) -> Stacked:
        if self.correction != "gradient":
            return grads
        return {n: g + extras[n] for n, g in grads.items()}

    def after_step(self, params: Stacked, extras: Stacked, lr: float) -> None:
        if self.correction == "after_step":
            for name, p in params.items():
                p.sub_(extras[name], alpha=lr)

    def step_count(self, stats: LocalStats, momentum: float) -> float:
        """a_i: the displacement of the round in units of lr times a gradient (a kept momentum
        buffer's carried gradient weight included, see `effective_steps`)."""
        if self.correction == "after_step":
            return float(stats.steps)
        return effective_steps(stats.steps, momentum, stats.carried)

    def finish(
        self, client_state: Tensors, state: Tensors, stats: LocalStats, sgd: SGDSettings
    ) -> tuple[Tensors, Tensors]:
        """(c_i+ - c_i, c_i+) with c_i+ = c_i - c + (x - y_i) / (a_i lr)."""
        c_i, scale = (
            self.control(client_state),
            1.0 / (self.step_count(stats, sgd.momentum) * sgd.lr),
        )
        new = {n: c_i[n] - c + scale * (self.global_state[n] - state[n]) for n, c in self.c.items()}
        return {n: new[n] - c_i[n] for n in new}, new


class Scaffold(Trainer):
    def init_server_state(self, global_state: Tensors) -> Tensors:
        params = {k: v for k, v in global_state.items() if k in self.param_names}
        return tensors.zeros_like(params)

    def download(self, round: int, server_state: Tensors) -> Tensors:
        return server_state

    def client_step(self, round: int, global_state: Tensors, server_state: Tensors) -> Controlled:
        return Controlled(self.config.correction, server_state, global_state)

    def aggregate(self, round, global_state, server_state, results, weights):
        sizes = self.setup.sizes
        total = sum(sizes)
        for r in results:
            for name, d in r.upload.items():
                server_state[name].add_(d, alpha=sizes[r.client] / total)
        return super().aggregate(round, global_state, server_state, results, weights)
