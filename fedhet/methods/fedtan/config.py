"""The spec blocks of FedTAN and the BatchNorm baselines (FedAvg Alg. 2, FedTAN-II, FedBN,
SiloBN)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.plugin import Count, InputError, MethodConfig, norm_kinds


class _BatchNormConfig(MethodConfig):
    """Every algorithm here acts on the model's BatchNorm layers: it must have some."""

    keeps_momentum_buffers: ClassVar[bool] = False  # clients' states are BN model entries

    def check(self, spec) -> None:
        super().check(spec)
        if "batch" in norm_kinds(spec.model):
            return
        if spec.model.norm == "batch":  # an mlp without hidden layers has no norm layer
            raise InputError(
                f"model.hidden: [] leaves the mlp no BatchNorm layer, which {self.name} needs; "
                "give it hidden layers"
            )
        raise InputError(f"model.norm: {self.name} needs BatchNorm layers; set model.norm: batch")


class FedTANConfig(_BatchNormConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.fedtan.algorithms:FedTAN"
    display_name: ClassVar[str | None] = "FedTAN"
    name: Literal["fedtan"] = "fedtan"


class FedAvgAlgorithm2Config(_BatchNormConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.fedtan.algorithms:FedAvgAlgorithm2"
    display_name: ClassVar[str | None] = "FedAvg+Algorithm 2"
    name: Literal["fedavg_alg2"] = "fedavg_alg2"


class FedTANIIConfig(_BatchNormConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.fedtan.algorithms:FedTANII"
    display_name: ClassVar[str | None] = "FedTAN-II"
    name: Literal["fedtan_ii"] = "fedtan_ii"
    sync_rounds: Count = Field(50, description="M: FedTAN rounds before BN stats freeze")
    frozen_lr_scale: float = Field(
        0.1, gt=0, le=1, description="lr multiplier once frozen (paper, MNIST: 0.5 -> 0.05)"
    )

    def settings(self) -> list[str]:
        return [
            *([f"M={self.sync_rounds}"] if self.sync_rounds != 50 else []),
            *([f"frozen lr x{self.frozen_lr_scale:g}"] if self.frozen_lr_scale != 0.1 else []),
        ]


class _LocalBatchNormConfig(_BatchNormConfig):
    """BatchNorm entries stay on each client: its own model is what is evaluated."""

    personalized: ClassVar[bool] = True
    # 1: each client's model scored on its own validation and test samples, not the pooled
    # sets (fedhet.engine.own_evaluation)
    revision: ClassVar[int] = 1


class FedBNConfig(_LocalBatchNormConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.fedtan.algorithms:FedBN"
    display_name: ClassVar[str | None] = "FedBN"
    name: Literal["fedbn"] = "fedbn"


class SiloBNConfig(_LocalBatchNormConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.fedtan.algorithms:SiloBN"
    display_name: ClassVar[str | None] = "SiloBN"
    name: Literal["silobn"] = "silobn"
