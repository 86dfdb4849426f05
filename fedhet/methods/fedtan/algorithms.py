"""FedTAN and the BatchNorm baselines it is compared with, as engine algorithms.

- `fedtan`: the first local step of every round runs in lockstep across the round's clients
  (`synchronized_gradients`, mode fedtan: BN statistics averaged layer by layer in the forward
  pass, Eq. 39-40, and their gradients in the backward pass, Eq. 41); the remaining local steps
  are ordinary local SGD; then FedAvg of all parameters and running statistics.
- `fedavg_alg2`: the same with forward-only aggregation (the paper's "FedAvg+Algorithm 2").
- `fedtan_ii`: FedTAN for the first M rounds, then the BN statistics are frozen (BN layers
  normalize with the global running statistics, which no longer change) and plain FedAvg.
- `fedbn`: BN layers (affine parameters and statistics) stay on the clients: never sent or averaged.
- `silobn`: BN statistics stay on the clients; BN affine parameters are shared and averaged.

FedAvg+BN, FedAvg+GN and centralized+BN need no code: `fedavg` / `centralized` with
`model.norm: batch | group`. The paper's E (local updating steps, 5) counts SGD steps: use
`federation.local_steps`.

Communication: the synchronized step's extra traffic (values from `communication_cost`, 4 bytes
each for float32 models, up and down per client) is added to the round's bytes_up/bytes_down,
and its extra server round trips to the round's `comm_rounds` (1 + 3L for FedTAN).
"""

from __future__ import annotations

import dataclasses
from functools import cached_property
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fedhet.methods.fedtan.sync_bn import Mode, SyncResult, bn_layers, synchronized_gradients
from fedhet.plugin import (
    ClientData,
    ClientJob,
    PartlyLocal,
    SGDSettings,
    Tensors,
    Traffic,
    Trainer,
    tensors,
)


def bn_state_names(model: nn.Module, parameters: bool, statistics: bool) -> frozenset[str]:
    """State-dict names of the model's BN affine parameters and/or running statistics."""
    names = set()
    for prefix, layer in model.named_modules():
        if not isinstance(layer, _BatchNorm):
            continue
        entries = [
            *(layer.named_parameters(recurse=False) if parameters else []),
            *(layer.named_buffers(recurse=False) if statistics else []),
        ]
        names.update(f"{prefix}.{name}" for name, _ in entries)
    return frozenset(names)


def freeze_batch_norm(model: nn.Module) -> None:
    """Normalize with the running statistics and stop updating them (BN layers in eval mode)."""
    for layer in bn_layers(model):
        layer.eval()


# --- FedTAN and forward-only aggregation -----------------------------------------------------


class FedTAN(Trainer):
    mode: ClassVar[Mode] = "fedtan"

    def synchronized_first_step(
        self, round: int, model: nn.Module, jobs: list[ClientJob], weights: list[float]
    ) -> Traffic:
        model.train()
        batches = [self.first_batch(job) for job in jobs]
        result = synchronized_gradients(model, batches, weights, F.cross_entropy, self.mode)
        statistics = tensors.clone(dict(model.named_buffers()))  # updated once, as for the union
        for job, gradients, loss in zip(jobs, result.gradients, result.losses, strict=True):
            job.first_step = _FirstStep(gradients, loss, statistics)
        return synchronized_traffic(result, len(jobs), _element_size(model))

    def first_batch(self, job: ClientJob) -> tuple[torch.Tensor, torch.Tensor]:
        """The first batch of the client's schedule, leaving its generator as it was."""
        state = job.generator.get_state()
        idx = next(iter(self.client_batches(job)))
        job.generator.set_state(state)
        return job.client.rows(idx)


class FedAvgAlgorithm2(FedTAN):
    """FedAvg whose first local step shares only the forward BN statistics (paper Algorithm 2)."""

    mode: ClassVar[Mode] = "forward_only"


@dataclasses.dataclass
class _FirstStep:
    """A client's synchronized first step: set its gradients and BN running statistics."""

    gradients: Tensors
    loss: float
    statistics: Tensors

    def __call__(self, model: nn.Module) -> torch.Tensor:
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(self.statistics[name])
        for name, param in model.named_parameters():
            param.grad = self.gradients[name].clone()
        return torch.tensor(self.loss)


def synchronized_traffic(result: SyncResult, clients: int, element_size: int) -> Traffic:
    """Each client uploads `values` numbers and receives as many; extra_rounds round trips."""
    per_client = int(result.communication["values"]) * element_size
    return Traffic(
        bytes_up=clients * per_client,
        bytes_down=clients * per_client,
        rounds=int(result.communication["extra_rounds"]),
    )


def _element_size(model: nn.Module) -> int:
    return next(model.parameters()).element_size()


# --- FedTAN-II --------------------------------------------------------------------------------


class FedTANII(FedTAN):
    """FedTAN for `sync_rounds` rounds, then frozen BN statistics and plain FedAvg."""

    vectorizable = False  # its loss puts the BN layers in eval mode once frozen (`local_loss`)

    def frozen(self, round: int) -> bool:
        return round >= self.config.sync_rounds

    @cached_property
    def statistics_names(self) -> frozenset[str]:
        return bn_state_names(self.build_model(), parameters=False, statistics=True)

    def synchronized_first_step(
        self, round: int, model: nn.Module, jobs: list[ClientJob], weights: list[float]
    ) -> Traffic:
        if self.frozen(round):
            return Traffic()
        return super().synchronized_first_step(round, model, jobs, weights)

    def client_sgd(self, round: int, client: ClientData, lr: float) -> SGDSettings:
        scale = self.config.frozen_lr_scale if self.frozen(round) else 1.0
        return super().client_sgd(round, client, lr * scale)

    def local_loss(
        self, job: ClientJob, model: nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        if self.frozen(job.round):
            freeze_batch_norm(model)  # after local_sgd's model.train()
        return super().local_loss(job, model, x, y)

    def aggregate(self, round, global_state, server_state, results, weights):
        averaged = super().aggregate(round, global_state, server_state, results, weights)
        if self.frozen(round):  # exactly the frozen values, not an average of copies
            averaged.update({n: global_state[n].clone() for n in self.statistics_names})
        return averaged


# --- FedBN and SiloBN -------------------------------------------------------------------------


class _LocalBatchNorm(PartlyLocal):
    """BN state entries in `local_names` stay on each client: its own entries (`own_names`),
    which it trains from and keeps in its client_state."""

    local_parameters: ClassVar[bool]

    @cached_property
    def local_names(self) -> frozenset[str]:
        return bn_state_names(self.build_model(), self.local_parameters, statistics=True)

    def evaluation_states(
        self, global_state: Tensors, client_states: dict[int, Tensors]
    ) -> list[Tensors]:
        """Each client's model (global shared part + its local BN), as the paper evaluates."""
        personal = [
            {**global_state, **client_states[c]} for c in sorted(client_states) if client_states[c]
        ]
        return personal or [global_state]


class FedBN(_LocalBatchNorm):
    local_parameters = True


class SiloBN(_LocalBatchNorm):
    local_parameters = False
