"""FedImpro (Tang et al.): decoupled training with shared per-class feature statistics.

The model is split at `split` into a low-level extractor and a high-level part. Each local
step trains on the real batch (N samples, through the whole model) and on N_hat features
sampled class-balanced from the global per-class Gaussian (through the high-level part only).
While training, the client tracks its per-class feature statistics (Eq. 7, starting from the
global ones it received); the server averages the uploads of the round's clients (Eq. 8) and
sends the result with the next model. Statistics cross the network, so they are counted in
bytes_up / bytes_down.

The local objective follows Theorem 4.2: the high-level part sees the mixture of the N real
and the N_hat sampled features, each sample weighted alike (real share N / (N + w N_hat),
with w the sampled-feature weight, 1 in the paper); the low-level part, which only real data
reach, keeps the gradient of the plain cross-entropy. With w = 0 this is exactly FedAvg.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from fedhet.core.errors import InputError
from fedhet.core.rng import torch_generator
from fedhet.core.spec import AlgorithmSpec, ModelSpec, Spec
from fedhet.engine.algorithm import Algorithm, ClientJob, ClientResult, TrainSetup
from fedhet.engine.tensors import Tensors
from fedhet.methods.fedimpro.objective import sampled_feature_loss
from fedhet.methods.fedimpro.statistics import (
    add_noise,
    aggregate_statistics,
    init_statistics,
    update_statistics,
)

if TYPE_CHECKING:
    from fedhet.core.pipeline import StageNode

MEAN, VAR = "feature_mean", "feature_var"
INIT_STD = 0.1  # std of the statistics before any client reported (the authors' code)


class FedImproConfig(AlgorithmSpec):
    name: Literal["fedimpro"] = "fedimpro"
    split: str | None = Field(
        None,
        description="split point, a stage of the model's feature extractor (`fedhet spec show` "
        "lists them); default: the middle one (layer2 of a ResNet, as the paper)",
    )
    momentum: float = Field(
        0.9, ge=0, lt=1, description="moving-average momentum of the client statistics (Eq. 7)"
    )
    samples: int | None = Field(
        None, ge=1, description="N_hat, sampled features per local step; default: the batch size"
    )
    weight: float = Field(
        1.0, ge=0, description="weight w of a sampled feature relative to a real one; 0 is FedAvg"
    )
    ramp_rounds: int = Field(
        0, ge=0, description="raise w linearly from 0 over this many rounds; 0 keeps it constant"
    )
    noise_std: float = Field(
        0.0, ge=0, description="std of Gaussian noise on the uploaded statistics (Table 7)"
    )
    std_clip: float | None = Field(
        None, gt=0, description="cap on the sampling std (the authors' code uses 0.1)"
    )

    def base_label(self) -> str:
        label = self.name + (f"@{self.split}" if self.split else "")
        if self.weight != 1 or self.ramp_rounds:
            ramp = f", ramp={self.ramp_rounds}" if self.ramp_rounds else ""
            label += f"(w={self.weight}{ramp})"
        if self.noise_std > 0:
            label += f"+noise={self.noise_std}"
        return label


# --- the split ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def _split_points(model_json: str) -> tuple[str, ...]:
    from fedhet.models import build_model

    # Split point names depend on the architecture only, not on the input shape or classes.
    model = build_model(ModelSpec.model_validate_json(model_json), (1, 32, 32), 2, seed=0)
    return tuple(model.split_points())


def resolve_split(points: list[str] | tuple[str, ...], split: str | None) -> str:
    """The configured split point, or the middle one; InputError naming the valid ones."""
    if split is None:
        return points[(len(points) - 1) // 2]
    if split not in points:
        raise InputError(
            f"algorithm.split: {split!r} is not a split point of this model; "
            f"choose one of {list(points)}"
        )
    return split


# --- the algorithm ------------------------------------------------------------------------


class FedImpro(Algorithm):
    name = "fedimpro"
    Config = FedImproConfig

    def __init__(self, config: FedImproConfig, setup: TrainSetup):
        super().__init__(config, setup)
        model = self.build_model()
        self.split = resolve_split(model.split_points(), config.split)
        low, _ = model.split(self.split)
        with torch.no_grad():
            self.feature_shape = tuple(low.eval()(torch.zeros(1, *setup.dataset.shape)).shape[1:])
        self._parts: tuple[nn.Module, nn.Module, nn.Module] | None = None

    @classmethod
    def plan(cls, spec: Spec) -> StageNode:
        resolve_split(_split_points(spec.model.model_dump_json()), spec.algorithm.split)
        return super().plan(spec)

    def split_model(self, model: nn.Module) -> tuple[nn.Module, nn.Module]:
        """(low, high) of `model`, sharing its parameters; cached for the engine's one model."""
        if self._parts is None or self._parts[0] is not model:
            self._parts = (model, *model.split(self.split))
        return self._parts[1], self._parts[2]

    def sampled_weight(self, round: int) -> float:
        ramp = self.config.ramp_rounds
        return self.config.weight * (min(1.0, round / ramp) if ramp else 1.0)

    # --- server side --------------------------------------------------------------------

    def init_server_state(self, global_state: Tensors) -> Tensors:
        dim = math.prod(self.feature_shape)
        gen = torch_generator(self.setup.spec.seed, "fedimpro", "init")
        mean, var = init_statistics(self.setup.dataset.num_classes, dim, INIT_STD, gen)
        return {MEAN: mean.to(self.setup.device), VAR: var.to(self.setup.device)}

    def download(self, server_state: Tensors) -> Tensors:
        return {MEAN: server_state[MEAN], VAR: server_state[VAR]}

    def aggregate(self, global_state, server_state, results, weights):
        uniform = [1 / len(results)] * len(results)  # Eq. 8
        server_state[MEAN], server_state[VAR] = aggregate_statistics(
            [r.upload[MEAN] for r in results], [r.upload[VAR] for r in results], uniform
        )
        return super().aggregate(global_state, server_state, results, weights)

    # --- client side --------------------------------------------------------------------

    def client_update(self, job: ClientJob) -> ClientResult:
        """Local training with the client's running statistics in `job.client_state`
        (they start from the global ones each round and leave with the upload)."""
        job.client_state[MEAN] = job.server_state[MEAN].clone()
        job.client_state[VAR] = job.server_state[VAR].clone()
        try:
            result = super().client_update(job)
        finally:
            mean, var = job.client_state.pop(MEAN), job.client_state.pop(VAR)
        mean, var = add_noise(mean, var, self.config.noise_std, job.generator)
        result.upload = {MEAN: mean, VAR: var}
        return result

    def local_loss(
        self, job: ClientJob, model: nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        low, high = self.split_model(model)
        features = low(x)
        update_statistics(
            job.client_state[MEAN], job.client_state[VAR], features, y, self.config.momentum
        )
        weight = self.sampled_weight(job.round)
        if weight == 0:
            return F.cross_entropy(high(features), y)
        count = self.config.samples or len(y)
        mean, var = job.server_state[MEAN], job.server_state[VAR]
        clip = self.config.std_clip
        return sampled_feature_loss(
            high, features, y, mean, var, count, weight, job.generator, clip
        )
