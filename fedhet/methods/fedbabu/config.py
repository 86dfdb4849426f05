"""FedBABU's spec block: `algorithm: {name: fedbabu, finetune_steps: 10, finetune: full}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.plugin import FineTunedConfig


class FedBABUConfig(FineTunedConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.fedbabu.algorithm:FedBABU"
    display_name: ClassVar[str | None] = "FedBABU"
    name: Literal["fedbabu"] = "fedbabu"
    finetune: Literal["full", "head"] = Field(
        "full", description="what fine-tuning trains: the whole model (the paper's) or the head"
    )

    def settings(self) -> list[str]:
        return [
            *([f"FT steps={self.finetune_steps}"] if self.finetune_steps != 10 else []),
            *(["FT head"] if self.finetune == "head" else []),
        ]
