"""The FedOpt family: a server optimizer on the pseudo-gradient (Reddi et al. 2021, "Adaptive
Federated Optimization", Alg. 1-2; Hsu et al. 2019, "Measuring the Effects of Non-Identical Data
Distribution for Federated Visual Classification", FedAvgM).

The clients train exactly as in FedAvg. In a round with reports the server forms
Delta = (weighted average of the clients' models) - x over the trainable parameters (the negated
pseudo-gradient) and moves x by its optimizer's update u: x+ = x + u, with (Alg. 2)
    m   = beta1 m + (1 - beta1) Delta
    v   = v + Delta^2                                      fedadagrad
    v   = beta2 v + (1 - beta2) Delta^2                    fedadam
    v   = v - (1 - beta2) Delta^2 sign(v - Delta^2)        fedyogi
    u   = eta m / (sqrt(v) + tau)
and for fedavgm (Hsu et al.: v <- beta v + Delta w, w <- w - v; with a learning rate, SGD with
momentum, as torch.optim.SGD without dampening): m = beta m + Delta, u = eta m.
Buffers (BatchNorm statistics) are averaged as in FedAvg, never optimized. The optimizer's state
(m, v and the step count t) is the run's server state (`m.<param>`, `v.<param>`, `step`), so
checkpoints hold it and a resumed or extended run continues it bit for bit; it never crosses
the network. A round nobody reports takes no server step (t does not advance).

Official code and defaults
- TCT's Table 3 FedAdam (Yu et al.): "following recommendation by [Reddi et al.], global learning
  rate 0.1", local lr from {1e-1, 1e-1.5, 1e-2, 1e-2.5, 1e-3}. TCT's public code
  (yaodongyu/TCT: README.md, mnist/run_TCT.py) has no FedAdam, so which Adam it ran is unknown.
  Hence server_lr 0.1 for the three adaptive methods.
- Reddi et al.'s experiments (google-research/federated, optimization/README.md and the
  hyperparameter README; utils/optimizers/optimizer_utils.py, yogi.py): FedAdam is Keras Adam,
  FedYogi their Keras Yogi, FedAdagrad Keras Adagrad (no first moment), all with initial
  accumulator 0 and epsilon = tau, recommended tau = 1e-3 ("at least 0.001"); FedAvgM is Keras
  SGD with server momentum 0.9. Keras Adam and their Yogi bias-correct the step size
  (eta sqrt(1 - beta2^t) / (1 - beta1^t), tau not corrected); Alg. 2 as printed has NO bias
  correction and starts v at v_{-1} >= tau^2. beta1 = 0.9, beta2 = 0.99 as in the paper's
  experiments (the large-cohort README's flags; one optimization README leaves Keras's 0.999).

Where fedhet differs, and why
- `form: paper` (default) is Alg. 2 as printed (v_{-1} = tau^2, no bias correction); `form: keras`
  is the authors' code (v starts at 0; fedadam/fedyogi bias-corrected as Keras Adam). Neither
  equals torch.optim.Adam, which also scales tau by sqrt(1 - beta2^t).
- fedadagrad's beta1 defaults to 0, as the authors' Keras Adagrad (Alg. 2 allows a momentum).
- Delta is the average weighted by the clients' sample counts (fedhet's FedAvg, renormalized
  over the clients that report), not Alg. 2's unweighted mean over the sampled clients, so the
  family's limits are fedhet's FedAvg.
- beta2 = 1 is allowed (outside Alg. 2's [0, 1)): v then stays at v_{-1}, a limit with no
  adaptivity.
- The new model is computed as average + (u - Delta), which equals x + u, so that where u is
  Delta itself (fedavgm with eta 1 and momentum 0; fedadam/fedyogi with eta 1, beta1 0,
  beta2 1, tau 1/2; fedadagrad with tau 2^20, eta 2^21, beta1 0 in float32) the new model IS
  FedAvg's average, bit for bit, rather than x + (average - x) with its rounding.
- The server learning rate is constant (as in the paper's main experiments); the clients' lr
  follows the federation's schedule.
"""

from __future__ import annotations

import math
from functools import cached_property

import torch

from fedhet.plugin import Tensors, Trainer


class ServerOptimizer:
    """The server's optimizer over named tensors, its state a dict of tensors (`init_state`)."""

    def __init__(self, config):
        self.config = config

    def init_state(self, params: Tensors) -> Tensors:
        """m = 0, v = v_{-1} (tau^2 in the paper's form, 0 in Keras's) and t = 0."""
        c = self.config
        first = next(iter(params.values()))
        state = {"step": torch.zeros((), dtype=torch.float64, device=first.device)}
        v0 = c.tau**2 if c.adaptive and c.form == "paper" else 0.0
        for name, p in params.items():
            state[f"m.{name}"] = torch.zeros_like(p)
            if c.adaptive:
                state[f"v.{name}"] = torch.full_like(p, v0)
        return state

    def step_size(self, t: int) -> float:
        """eta, bias-corrected as Keras Adam for fedadam/fedyogi in the Keras form."""
        c = self.config
        if c.adaptive and c.form == "keras" and c.name in ("fedadam", "fedyogi"):
            return c.server_lr * math.sqrt(1 - c.beta2**t) / (1 - c.beta1**t)
        return c.server_lr

    def update(self, delta: Tensors, state: Tensors) -> Tensors:
        """u (x+ = x + u) for the round's Delta = average - x; `state` is advanced in place."""
        c = self.config
        t = int(state["step"].item()) + 1
        state["step"].fill_(t)
        lr = self.step_size(t)
        out = {}
        for name, d in delta.items():
            m = state[f"m.{name}"]
            if not c.adaptive:  # fedavgm
                m.mul_(c.server_momentum).add_(d)
                out[name] = lr * m
                continue
            m.mul_(c.beta1).add_(d, alpha=1 - c.beta1)
            v, d2 = state[f"v.{name}"], d * d
            if c.name == "fedadagrad":
                v.add_(d2)
            elif c.name == "fedadam":
                v.mul_(c.beta2).add_(d2, alpha=1 - c.beta2)
            elif c.name == "fedyogi":
                v.sub_(torch.sign(v - d2) * d2, alpha=1 - c.beta2)
            else:
                raise ValueError(f"no server optimizer named {c.name!r}")
            out[name] = lr * m / (v.sqrt() + c.tau)
        return out


class FedOpt(Trainer):
    @cached_property
    def optimizer(self) -> ServerOptimizer:
        return ServerOptimizer(self.config)

    def init_server_state(self, global_state: Tensors) -> Tensors:
        params = {n: v for n, v in global_state.items() if n in self.param_names}
        return self.optimizer.init_state(params)

    def aggregate(self, round, global_state, server_state, results, weights):
        averaged = super().aggregate(round, global_state, server_state, results, weights)
        delta = {n: averaged[n] - x for n, x in global_state.items() if n in self.param_names}
        update = self.optimizer.update(delta, server_state)
        # average + (u - Delta) = x + u; buffers (BatchNorm statistics) stay averaged
        return {n: a + (update[n] - delta[n]) if n in update else a for n, a in averaged.items()}
