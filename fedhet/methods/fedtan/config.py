"""The spec blocks of FedTAN and the BatchNorm baselines (FedAvg Alg. 2, FedTAN-II, FedBN,
SiloBN)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.core.sections import MAX_COUNT
from fedhet.engine.description import MethodConfig


class FedTANConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.fedtan.algorithms:FedTAN"
    name: Literal["fedtan"] = "fedtan"

    def base_label(self) -> str:
        return "FedTAN"


class FedAvgAlgorithm2Config(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.fedtan.algorithms:FedAvgAlgorithm2"
    name: Literal["fedavg_alg2"] = "fedavg_alg2"

    def base_label(self) -> str:
        return "FedAvg+Algorithm 2"


class FedTANIIConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.fedtan.algorithms:FedTANII"
    name: Literal["fedtan_ii"] = "fedtan_ii"
    sync_rounds: int = Field(
        50, ge=1, le=MAX_COUNT, description="M: FedTAN rounds before BN stats freeze"
    )
    frozen_lr_scale: float = Field(
        0.1, gt=0, le=1, description="lr multiplier once frozen (paper, MNIST: 0.5 -> 0.05)"
    )

    def base_label(self) -> str:
        return f"FedTAN-II (M={self.sync_rounds})"


class FedBNConfig(MethodConfig):
    personalized: ClassVar[bool] = True
    trainer: ClassVar[str | None] = "fedhet.methods.fedtan.algorithms:FedBN"
    name: Literal["fedbn"] = "fedbn"

    def base_label(self) -> str:
        return "FedBN"


class SiloBNConfig(MethodConfig):
    personalized: ClassVar[bool] = True
    trainer: ClassVar[str | None] = "fedhet.methods.fedtan.algorithms:SiloBN"
    name: Literal["silobn"] = "silobn"

    def base_label(self) -> str:
        return "SiloBN"
