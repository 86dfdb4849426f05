"""`fedrod`: On Bridging Generic and Personalized Federated Learning (Chen & Chao, 2022),
Fed-RoD with a linear personalized head.

The model has one body and two heads. The generic head is trained with the balanced softmax
loss (BSM, Ren et al. 2020): cross-entropy on the logits plus the log of the client's class
prior (its label counts n_c over n), a loss whose minimizer is the class-balanced classifier
whatever the client's label skew; body and generic head are averaged by the server as FedAvg
does. The personalized head reads the body's features without passing gradients back into
them and is trained by cross-entropy on the generic logits (detached) plus its own; it stays on
the client. A client predicts with generic + personalized logits; the generic model alone is the
federation's.

The official repository (hongyouc/Fed-RoD) held its README only in the version read, so the
details follow the paper and PFLlib (TsingZ0/PFLlib, clientrod.py): BSM with the client's
label counts, the personalized head a linear layer on the detached features, trained on the same
batch by its own SGD at the same learning rate after the generic step (with logits computed
before it). Here both losses are summed and taken in one step of the clients' local SGD: the
generic parameters get BSM's gradients alone and the personalized head CE's alone (the detaching
keeps them apart), so this is the same step.

Where fedhet differs, and why: PFLlib starts the personalized head as a copy of the generic
head, which doubles the initial logits; here it starts at zero, so a client that has never
trained predicts exactly as the generic model (and is scored so in `fedhet eval`). A class a
client does not hold has prior 0: its logit gets -inf in BSM, as in PFLlib (the client's
labels never are that class, so the loss and its gradients stay finite).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.plugin import ClientJob, FedModel, PartlyLocal


class GenericAndPersonal(nn.Module):
    """A fedhet model (`net`: body and generic head) with a zero-initialized linear
    personalized head on its features (`personal`); forward gives generic + personal logits."""

    def __init__(self, net: FedModel):
        super().__init__()
        self.net = net
        self.personal = nn.Linear(net.feature_dim, net.head.out_features)
        nn.init.zeros_(self.personal.weight)
        nn.init.zeros_(self.personal.bias)

    def both_logits(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(generic, personal) logits; the personal head sees the features detached."""
        features = self.net.features(x)
        return self.net.head(features), self.personal(features.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        generic, personal = self.both_logits(x)
        return generic + personal


def balanced_softmax_loss(
    logits: torch.Tensor, y: torch.Tensor, log_prior: torch.Tensor
) -> torch.Tensor:
    """Mean cross-entropy of the logits shifted by the log class prior."""
    return F.cross_entropy(logits + log_prior, y)


def log_prior(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """log(n_c / n) of a client's labels in float64 (-inf for a class it does not hold)."""
    counts = torch.bincount(labels, minlength=num_classes).double()
    return torch.log(counts / counts.sum())


class FedRoD(PartlyLocal):
    vectorizable = False  # its loss is two heads' (balanced softmax and the personal CE)

    def build_model(self) -> nn.Module:
        return GenericAndPersonal(super().build_model())

    def local_layers(self) -> list[str]:
        return ["personal"]

    def global_model(self, global_state):
        """The generic model: the server's personalized head is the initial zero one."""
        return global_state

    def client_context(self, job: ClientJob) -> torch.Tensor:
        return log_prior(job.client.y, self.setup.dataset.num_classes).float()

    def local_loss(self, job: ClientJob, model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        generic, personal = model.both_logits(x)
        personalized = F.cross_entropy(generic.detach() + personal, y)
        return balanced_softmax_loss(generic, y, job.context) + personalized
