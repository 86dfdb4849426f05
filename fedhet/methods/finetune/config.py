"""FedAvg-FT's spec block: `algorithm: {name: finetune, finetune_steps: 10}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from fedhet.plugin import FineTunedConfig


class FineTuneConfig(FineTunedConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.finetune.algorithm:FineTune"
    name: Literal["finetune"] = "finetune"

    def base_label(self) -> str:
        return f"FedAvg-FT ({self.finetune_steps} steps)"
