"""FedBABU's spec block: `algorithm: {name: fedbabu, finetune_steps: 10, finetune: full}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.plugin import FineTunedConfig


class FedBABUConfig(FineTunedConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.fedbabu.algorithm:FedBABU"
    name: Literal["fedbabu"] = "fedbabu"
    finetune: Literal["full", "head"] = Field(
        "full", description="what fine-tuning trains: the whole model (the paper's) or the head"
    )

    def base_label(self) -> str:
        return f"FedBABU (FT {self.finetune_steps} steps)"
