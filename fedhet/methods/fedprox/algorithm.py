"""FedProx: FedAvg with the proximal term mu/2 ||w - w_global||^2 in the local objective."""

import torch
from torch import nn

from fedhet.engine.trainer import ClientJob, Trainer
from fedhet.engine.vectorized import ProximalTerm


class FedProx(Trainer):
    def local_loss(
        self, job: ClientJob, model: nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        loss = super().local_loss(job, model, x, y)
        if self.config.mu == 0:
            return loss
        prox = sum(((p - job.global_state[n]) ** 2).sum() for n, p in model.named_parameters())
        return loss + 0.5 * self.config.mu * prox

    def vectorized_term(self, jobs: list[ClientJob]) -> ProximalTerm:
        anchor = {n: v for n, v in jobs[0].global_state.items() if n in self.param_names}
        return ProximalTerm(self.config.mu, anchor)
