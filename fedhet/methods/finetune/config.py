"""FedAvg-FT's spec block: `algorithm: {name: finetune, finetune_steps: 10}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from fedhet.plugin import FineTunedConfig


class FineTuneConfig(FineTunedConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.finetune.algorithm:FineTune"
    display_name: ClassVar[str | None] = "FedAvg-FT"
    name: Literal["finetune"] = "finetune"

    def settings(self) -> list[str]:
        return [f"FT steps={self.finetune_steps}"] if self.finetune_steps != 10 else []
