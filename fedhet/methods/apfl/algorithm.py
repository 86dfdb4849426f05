"""APFL (Y. Deng, M. M. Kamani, M. Mahdavi, "Adaptive Personalized Federated Learning", 2020),
Algorithm 1.

Each client i keeps a local model v_i and a mixing weight alpha_i beside its copy of the global
model w; its personalized model is the mixture v_bar = alpha_i v_i + (1 - alpha_i) w. A local
step on a batch, from (w, v_i, alpha_i):

    w       <- w - lr grad f_i(w)                       (FedAvg's local step)
    v_i     <- v_i - lr grad_v f_i(v_bar) = v_i - lr alpha_i grad f_i(v_bar)
    alpha_i <- clip(alpha_i - lr <v_i - w, grad f_i(v_bar)>, 0, 1)   (when `adaptive`)

all three gradients taken at the step's starting point on the same batch; the server averages
the w's as FedAvg. Each client is evaluated with alpha_i v_i + (1 - alpha_i) w, w the current
global model.

The official code (MLOPTPSU/FedTorch, fedtorch/comms/trainings/federated/apfl.py) differs from
the paper in three ways, and fedhet follows the paper in each:
- it mixes the two models' outputs, alpha v(x) + (1 - alpha) w(x), not their parameters (the
  paper's v_bar, which PFLlib's APFL also mixes), so the personalized model is one network;
- it updates alpha once per round (the first local step), from alpha grad_v + (1 - alpha)
  grad_w of the two models' separate losses plus 0.02 alpha; fedhet takes the paper's alpha step
  at every local step, with the exact gradient <v - w, grad f(v_bar)> (autograd through alpha);
- it takes v's step after w's (v_bar from the updated w); the paper's steps, as fedhet's, start
  from the same point.
Every step uses the federation's local SGD (momentum reset each round, weight decay) for v as for
w; alpha's step is plain, at the round's lr. With alpha fixed at 0 (`adaptive: false`), every
client's personalized model is the global model, and the run is FedAvg's bit for bit
(tests/test_pfl_personal.py).

A client keeps v_i and alpha_i in its client state, so they are checkpointed, resumed and
extended with the run; one that never trained has the initial model as v_i and `alpha`.
BatchNorm statistics (not parameters) are v's own during its steps, and are mixed as the
parameters are in the evaluated model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedhet.plugin import ClientJob, OwnModel, Tensors, TrainedBeside, stored

LOCAL = "local."  # + a model state name: the client's local model v_i
ALPHA = "alpha"  # the client's mixing weight


def mixture_loss(
    local: nn.Module,
    w: dict[str, torch.Tensor],
    alpha: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
) -> torch.Tensor:
    """Cross-entropy of the mixture alpha v + (1 - alpha) w (v: `local`'s parameters, w fixed),
    differentiable in v and alpha; the buffers are `local`'s."""
    mixed = {n: alpha * v + (1 - alpha) * w[n] for n, v in local.named_parameters()}
    return F.cross_entropy(functional_call(local, mixed, (x,)), y)


class Mixture(OwnModel):
    """A client's v_i and alpha_i during a round: one step per local step, at the step's w."""

    def __init__(
        self,
        local: nn.Module,
        optimizer: torch.optim.SGD,
        alpha: torch.Tensor,
        adaptive: bool,
        lr: float,
    ):
        super().__init__(local, optimizer, LOCAL)
        self.alpha, self.adaptive, self.lr = alpha, adaptive, lr

    def loss(self, w: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.stepped = self.alpha.clone().requires_grad_(self.adaptive)  # alpha, for its gradient
        fixed = {n: p.detach() for n, p in w.named_parameters()}
        return mixture_loss(self.model, fixed, self.stepped, x, y)

    def after_step(self) -> None:
        if self.adaptive:
            self.alpha = (self.alpha - self.lr * self.stepped.grad).clamp(0.0, 1.0)

    def state(self) -> Tensors:
        return {**super().state(), ALPHA: self.alpha.detach().clone()}


class APFL(TrainedBeside):
    """Each client's v_i and alpha_i train beside its copy of w."""

    def local_model(self, client_state: Tensors) -> tuple[Tensors, torch.Tensor]:
        """The client's (v_i, alpha_i)."""
        alpha = client_state.get(ALPHA)
        if alpha is None:
            alpha = torch.tensor(self.config.alpha, device=self.setup.device)
        return stored(client_state, LOCAL) or self.initial_model, alpha

    def client_context(self, job: ClientJob) -> Mixture:
        state, alpha = self.local_model(job.client_state)
        local, optimizer = self.own_copy(job, state, job.sgd)
        return Mixture(local, optimizer, alpha, self.config.adaptive, job.sgd.lr)

    def personalized(self, global_state: Tensors, client_state: Tensors) -> Tensors:
        local, alpha = self.local_model(client_state)
        return {
            n: alpha * local[n] + (1 - alpha) * w if w.is_floating_point() else w
            for n, w in global_state.items()
        }
