"""FedDyn (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021), Alg. 1.

Client k, sampled in round t, starts from the server model theta^{t-1} and minimizes

    L_k(theta) - <g_k, theta> + alpha_k / 2 ||theta - theta^{t-1}||^2

(g_k: its gradient state, 0 before its first round), then keeps
g_k <- g_k - alpha_k (theta_k^t - theta^{t-1}). The server keeps h (0 at the start):

    h^t     = h^{t-1} - alpha / m * sum_{k in P_t} (theta_k^t - theta^{t-1})
    theta^t = (1 / |P_t|) sum_{k in P_t} theta_k^t - h^t / alpha

with m the number of all clients. Here the regularizer is the client step's loss term
(`Dynamic.client_loss`: it reads the client's g_k and alpha_k, its extras), g_k is the client's
persistent state (`finish`), h the server state; both executors run it.

Official code consulted (alpemreacar/FedDyn, the first author's: utils_methods.py `train_FedDyn`,
utils_general.py `train_feddyn_mdl`, example_cifar_10.py), followed here:
- alpha_k = alpha / (n_k / mean n) ("adaptive alpha coef"): a client with more samples is
  regularized less, so the method minimizes the sample-weighted loss; with equal sizes alpha_k =
  alpha, Alg. 1's. `alpha_per_client: uniform` gives Alg. 1's alpha to every client.
- The server averages the round's client models UNIFORMLY (np.mean, not by size), as Alg. 1.
- Its state is L_k = sum of (theta_k - theta_server) = -g_k / alpha_k, and the local loss is
  CE + alpha_k <theta, L_k - theta_server> with alpha_k + weight_decay as SGD's weight decay:
  the same gradient as the objective above. The server model is mean + mean over all clients of
  L_k, which is -h / alpha above.
- Weight decay: the example adds weight_decay = 1e-3 to every method's SGD (FedAvg's too), none
  of FedDyn's own; fedhet's is `federation.weight_decay`, shared by all methods likewise.
- Default alpha 0.01: the example's `alpha_coef` (the paper searches {0.1, 0.01, 0.001}). TCT's
  repository (yaodongyu/TCT) holds only its MNIST example; its paper (App. B.1) tuned FedDyn's
  local lr over {0.1, 0.01, 0.001} as FedAvg's and does not state alpha.

Where fedhet differs, and why:
- The model evaluated is the server model theta^t (Alg. 1's output, the one clients download),
  as for every fedhet method; the official code records three (the mean of the round's client
  models, the mean of all clients' last models, the server model) and its example plots the
  second.
- No gradient clipping: the official code clips every method's gradients at norm 10, fedhet
  clips none.
- m (and the mean size in alpha_k) counts the clients that hold data: all clients unless the
  partition leaves some empty, and an empty client never trains.
- The recorded train loss includes the regularizer, as the official code's printed loss does.

alpha -> 0 is NOT FedAvg: the clients' terms vanish (they train as FedAvg's clients), but
h^t / alpha = -(1/m) sum_{r <= t} sum_{k in P_r} (theta_k^r - theta^{r-1}) does not depend on
alpha, so the server keeps adding the accumulated client drift (with full participation the first
round already moves 2x the mean update). tests/test_feddyn.py measures both halves.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedhet.plugin import (
    ClientData,
    ClientStep,
    LocalStats,
    SGDSettings,
    Stacked,
    Tensors,
    Trainer,
    tensors,
)

ALPHA = "feddyn.alpha"  # the client's alpha_k, in its state and extras (no parameter's name)


class Dynamic(ClientStep):
    """A client's dynamic regularizer around the round's server model `anchor` (its extras: its
    gradient state g_k by parameter name, and its alpha_k), and its new g_k once trained."""

    def __init__(self, anchor: Tensors):
        self.anchor = anchor  # theta^{t-1}, parameters only

    def gradient_state(self, client_state: Tensors) -> Tensors:
        """g_k: the client's gradient state (0 before its first round)."""
        return {
            n: client_state[n] if n in client_state else torch.zeros_like(a)
            for n, a in self.anchor.items()
        }

    def extras(self, client_state: Tensors) -> Tensors:
        return self.gradient_state(client_state) | {ALPHA: client_state[ALPHA]}

    def client_loss(self, params: Stacked, extras: Stacked) -> Tensor:
        """alpha_k / 2 ||theta - theta^{t-1}||^2 - <g_k, theta>, [clients]."""
        quadratic = sum(((p - self.anchor[n]) ** 2).flatten(1).sum(1) for n, p in params.items())
        linear = sum((p * extras[n]).flatten(1).sum(1) for n, p in params.items())
        return 0.5 * extras[ALPHA] * quadratic - linear

    def finish(
        self, client_state: Tensors, state: Tensors, stats: LocalStats, sgd: SGDSettings
    ) -> tuple[Tensors, Tensors]:
        """(nothing beyond the model, the new g_k = g_k - alpha_k (theta_k - theta^{t-1}))."""
        g, alpha = self.gradient_state(client_state), client_state[ALPHA]
        return {}, {n: g[n] - alpha * (state[n] - a) for n, a in self.anchor.items()}


class FedDyn(Trainer):
    def init_server_state(self, global_state: Tensors) -> Tensors:
        """h: zero, one tensor per parameter."""
        return tensors.zeros_like({n: v for n, v in global_state.items() if n in self.param_names})

    def client_alpha(self, client: ClientData) -> float:
        """alpha_k: alpha, scaled by (mean size) / n_k unless `alpha_per_client: uniform`."""
        alpha = self.config.alpha
        if self.config.alpha_per_client == "uniform":
            return alpha
        holders = self.setup.holders
        mean = sum(self.setup.sizes[c] for c in holders) / len(holders)
        return alpha * mean / client.n

    def initial_client_state(self, client: ClientData) -> Tensors:
        return {ALPHA: torch.tensor(self.client_alpha(client), device=self.setup.device)}

    def client_step(self, round: int, global_state: Tensors, server_state: Tensors) -> Dynamic:
        return Dynamic({n: v for n, v in global_state.items() if n in self.param_names})

    def aggregate(self, round, global_state, server_state, results, weights):
        """h^t and theta^t (Alg. 1): the round's models averaged uniformly (buffers too), then
        -h^t / alpha added to the parameters; h counts every client that holds data."""
        alpha, m = self.config.alpha, len(self.setup.holders)
        uniform = [1.0 / len(results)] * len(results)
        new = tensors.weighted_average([r.state for r in results], uniform)
        for name, h in server_state.items():
            drift = sum(r.state[name] - global_state[name] for r in results)
            h.sub_(drift, alpha=alpha / m)
            new[name] = new[name] - h / alpha
        return new
