"""FedImpro (Tang et al.): decoupled training with shared per-class feature statistics.

The model is split at `split` into a low-level extractor and a high-level part. Each local
step trains on the real batch (N samples, through the whole model) and on N_hat features
sampled class-balanced from a per-class Gaussian (through the high-level part only): the
global statistics received this round, or (`sample_from: client`, the authors' code) the
client's running ones. While training, the client tracks its per-class feature statistics
(Eq. 7, starting from the global ones it received; each batch updates them after its features
were sampled); the server averages the uploads of the round's clients (Eq. 8) and sends the
result with the next model. Statistics cross the network, so they are counted in bytes_up /
bytes_down.

Defaults follow the experiments behind the paper's tables (the authors' code): the objective
CE(real) + w_t CE(sampled) with w_t = w t / R rising linearly from 0 and not capped, R = 500
rounds (`ramp_rounds`; `ramp` gives R as a fraction of the run instead; `ramp_cap` holds w_t
at w from round R on, and `ramp: 0` keeps it at w throughout, the paper's Eq. 6), the sampling std
capped at 0.1, and the split in the middle of the network (ResNet: after layer2; simple_cnn:
after the conv layers), so the high-level part holds most parameters. The authors' rate of
the statistics (min(1, n_c / 5000) per step) is `rate_samples: 5000`.
`objective: mixture` is Theorem 4.2's form (see objective.py). With w = 0 this is FedAvg.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.methods.fedimpro.config import FedImproConfig, resolve_split
from fedhet.methods.fedimpro.objective import sampled_feature_loss
from fedhet.methods.fedimpro.statistics import (
    add_noise,
    aggregate_statistics,
    init_statistics,
    update_statistics,
)
from fedhet.plugin import ClientJob, Tensors, Trainer, TrainSetup, torch_generator

MEAN, VAR = "feature_mean", "feature_var"
INIT_STD = 0.1  # std of the statistics before any client reported (the authors' code)


@dataclass
class ClientRound:
    """A client's round: its model's two parts (sharing its parameters) and its running
    statistics, starting from the global ones it received, updated in place by every batch."""

    low: nn.Module
    high: nn.Module
    mean: torch.Tensor
    var: torch.Tensor


class FedImpro(Trainer):
    vectorizable = False  # its loss samples features and updates the client's statistics

    def __init__(self, config: FedImproConfig, setup: TrainSetup):
        super().__init__(config, setup)
        model = self.build_model()
        self.split = resolve_split(model.split_points(), config.split)
        low, _ = model.split(self.split)
        with torch.no_grad():
            self.feature_shape = tuple(low.eval()(torch.zeros(1, *setup.dataset.shape)).shape[1:])

    def sampled_weight(self, round: int) -> float:
        """w_t of round t (0-based), as the authors' `gradual2half`: w t / R, not capped (held at
        w from t = R on with `ramp_cap`)."""
        ramp = self.config.ramp_length(self.fed.rounds)
        share = round / ramp if ramp else 1.0
        return self.config.weight * (min(share, 1.0) if self.config.ramp_cap else share)

    # --- server side --------------------------------------------------------------------

    def init_server_state(self, global_state: Tensors) -> Tensors:
        dim = math.prod(self.feature_shape)
        gen = torch_generator(self.setup.spec.seed, "fedimpro", "init")
        mean, var = init_statistics(self.setup.dataset.num_classes, dim, INIT_STD, gen)
        return {MEAN: mean.to(self.setup.device), VAR: var.to(self.setup.device)}

    def download(self, round: int, server_state: Tensors) -> Tensors:
        return {MEAN: server_state[MEAN], VAR: server_state[VAR]}

    def aggregate(self, round, global_state, server_state, results, weights):
        uniform = [1 / len(results)] * len(results)  # Eq. 8
        server_state[MEAN], server_state[VAR] = aggregate_statistics(
            [r.upload[MEAN] for r in results], [r.upload[VAR] for r in results], uniform
        )
        return super().aggregate(round, global_state, server_state, results, weights)

    # --- client side --------------------------------------------------------------------

    def client_context(self, job: ClientJob) -> ClientRound:
        low, high = job.model.split(self.split)
        stats = job.server_state
        return ClientRound(low, high, stats[MEAN].clone(), stats[VAR].clone())

    def client_finish(self, job: ClientJob, state: Tensors) -> tuple[Tensors, Tensors]:
        """The client's running statistics leave, noised, with its model; it keeps nothing."""
        own = job.context
        mean, var = add_noise(own.mean, own.var, self.config.noise_std, job.generator)
        return {MEAN: mean, VAR: var}, {}

    def local_loss(
        self, job: ClientJob, model: nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        own = job.context
        features = own.low(x)
        config = self.config
        if config.weight == 0:
            loss = F.cross_entropy(own.high(features), y)
        else:
            # sampled before this batch updates the client's statistics (the authors' order)
            if config.sample_from == "client":
                mean, var = own.mean, own.var
            else:
                mean, var = job.server_state[MEAN], job.server_state[VAR]
            loss = sampled_feature_loss(
                own.high,
                features,
                y,
                mean,
                var,
                config.samples or len(y),
                self.sampled_weight(job.round),
                job.generator,
                config.std_clip,
                config.objective,
            )
        update_statistics(
            own.mean,
            own.var,
            features,
            y,
            config.momentum,
            config.rate_samples,
        )
        return loss
