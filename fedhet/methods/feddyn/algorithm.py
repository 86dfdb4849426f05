"""FedDyn (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021), Alg. 1.

Client k, sampled in round t, starts from the server model theta^{t-1} and minimizes

    L_k(theta) - <g_k, theta> + alpha_k / 2 ||theta - theta^{t-1}||^2

(g_k: its gradient state, 0 before its first round), then keeps
g_k <- g_k - alpha_k (theta_k^t - theta^{t-1}). The server keeps h (0 at the start):

    h^t     = h^{t-1} - alpha / m * sum_{k in P_t} (theta_k^t - theta^{t-1})
    theta^t = (1 / |P_t|) sum_{k in P_t} theta_k^t - h^t / alpha

with m the number of all clients. Here the regularizer's gradient is split as the official code
splits it: the linear part -<g_k + alpha_k theta^{t-1}, theta> is the client step's loss term
(`Dynamic.client_loss`: it reads the client's g_k and alpha_k, its extras), clipped with the
data term's gradient at `clip_norm` (`Dynamic.correct`), and alpha_k theta is added after the
clip, as weight decay; g_k is the client's persistent state (`finish`), h the server state; both
executors run it.

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
- Gradient clipping (utils_general.py `train_feddyn_mdl`, `max_norm = 10`): the gradient of
  CE + alpha_k <theta, L_k - theta_server> is clipped to norm 10 (torch's `clip_grad_norm_`)
  before SGD adds the weight decay alpha_k theta (+ weight_decay theta), so the clip never
  shrinks the pull towards 0. `clip_norm` sets the norm; null clips nothing (then the step is
  the objective's plain gradient step). A client of the vectorized executor is clipped by its
  own norm, as alone.
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
- Only FedDyn clips: the official code clips every method's gradients at norm 10, fedhet's
  other methods clip none (FedDyn diverged without it where the others trained: TCT Table 3's
  lr 0.1).
- m (and the mean size in alpha_k) counts the clients that hold data: all clients unless the
  partition leaves some empty, and an empty client never trains.
- The recorded train loss includes the regularizer alpha_k / 2 ||theta - theta^{t-1}||^2 -
  <g_k, theta> (its value; its gradient is the clipped linear part and the weight decay), as
  the official code's printed loss does up to a constant.

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
    gradient_only,
    tensors,
)

ALPHA = "feddyn.alpha"  # the client's alpha_k, in its state and extras (no parameter's name)


class Dynamic(ClientStep):
    """A client's dynamic regularizer around the round's server model `anchor` (its extras: its
    gradient state g_k by parameter name, and its alpha_k), its gradient clipped at `clip_norm`
    but for alpha_k theta, and its new g_k once trained."""

    def __init__(self, anchor: Tensors, clip_norm: float | None = None):
        self.anchor = anchor  # theta^{t-1}, parameters only
        self.clip_norm = clip_norm

    def gradient_state(self, client_state: Tensors) -> Tensors:
        """g_k: the client's gradient state (0 before its first round)."""
        return {
            n: client_state[n] if n in client_state else torch.zeros_like(a)
            for n, a in self.anchor.items()
        }

    def extras(self, client_state: Tensors) -> Tensors:
        return self.gradient_state(client_state) | {ALPHA: client_state[ALPHA]}

    def client_loss(self, params: Stacked, extras: Stacked) -> Tensor:
        """alpha_k / 2 ||theta - theta^{t-1}||^2 - <g_k, theta>, [clients], whose gradient is its
        linear part's, -(g_k + alpha_k theta^{t-1}): `correct` adds alpha_k theta after the
        clip."""
        alpha = extras[ALPHA]
        quadratic = sum(((p - self.anchor[n]) ** 2).flatten(1).sum(1) for n, p in params.items())
        linear = sum((p * extras[n]).flatten(1).sum(1) for n, p in params.items())
        pull = sum((p * self.anchor[n]).flatten(1).sum(1) for n, p in params.items())
        value = 0.5 * alpha * quadratic - linear
        return value.detach() + gradient_only(-linear - alpha * pull)

    def correct(self, grads: Stacked, extras: Stacked, params: Stacked) -> Stacked:
        """Each client's gradient clipped to norm `clip_norm`, then alpha_k theta added."""
        clipped = clip_by_norm(grads, self.clip_norm)
        alpha = extras[ALPHA]
        return {n: g + per_client(alpha, g) * params[n] for n, g in clipped.items()}

    def finish(
        self, client_state: Tensors, state: Tensors, stats: LocalStats, sgd: SGDSettings
    ) -> tuple[Tensors, Tensors]:
        """(nothing beyond the model, the new g_k = g_k - alpha_k (theta_k - theta^{t-1}))."""
        g, alpha = self.gradient_state(client_state), client_state[ALPHA]
        return {}, {n: g[n] - alpha * (state[n] - a) for n, a in self.anchor.items()}


def clip_by_norm(grads: Stacked, max_norm: float | None) -> Stacked:
    """Each client's gradients scaled as torch's `clip_grad_norm_` scales one model's: by
    min(1, max_norm / (norm + 1e-6)) with norm that of all its gradients together; None: as
    they are."""
    if max_norm is None:
        return grads
    squares = sum(g.flatten(1).pow(2).sum(1) for g in grads.values())
    scale = (max_norm / (squares.sqrt() + 1e-6)).clamp(max=1.0)
    return {n: g * per_client(scale, g) for n, g in grads.items()}


def per_client(values: Tensor, like: Tensor) -> Tensor:
    """[clients] values shaped to broadcast over `like` (a leading client dim)."""
    return values.view(-1, *[1] * (like.dim() - 1))


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
        anchor = {n: v for n, v in global_state.items() if n in self.param_names}
        return Dynamic(anchor, self.config.clip_norm)

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
