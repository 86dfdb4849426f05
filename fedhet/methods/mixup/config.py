"""FedAvg + Mixup's spec block: `algorithm: {name: mixup, alpha: ...}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.plugin import MethodConfig, MixupAlpha

DEFAULT_ALPHA = 0.2  # LINs-lab/FedBR fedbr/hparams_registry.py: mixup_alpha's default


class MixupConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.mixup.algorithm:MixupTrainer"
    display_name: ClassVar[str | None] = "FedAvg+Mixup"
    name: Literal["mixup"] = "mixup"
    alpha: MixupAlpha = Field(
        DEFAULT_ALPHA, description="lambda ~ Beta(alpha, alpha) per local batch (FedBR's code: 0.2)"
    )

    def input_steps(self) -> str | None:
        return "mixes two samples' inputs"

    def settings(self) -> list[str]:
        return [] if self.alpha == DEFAULT_ALPHA else [f"alpha={self.alpha:g}"]
