"""FedBABU's spec block: `algorithm: {name: fedbabu, finetune_steps: 10, finetune: full}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.plugin import MAX_COUNT, MethodConfig


class FedBABUConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.fedbabu.algorithm:FedBABU"
    # each client's model is the global one fine-tuned on its data, at every evaluation
    personalized: ClassVar[bool] = True
    display_name: ClassVar[str | None] = "FedBABU"
    name: Literal["fedbabu"] = "fedbabu"
    finetune_steps: int = Field(
        10, ge=0, le=MAX_COUNT, description="local SGD steps of fine-tuning at evaluation"
    )
    finetune_lr: float | None = Field(
        None, gt=0, description="the fine-tuning learning rate; default: federation.lr"
    )
    finetune: Literal["full", "head"] = Field(
        "full", description="what fine-tuning trains: the whole model (the paper's) or the head"
    )

    def settings(self) -> list[str]:
        return [
            *([f"FT steps={self.finetune_steps}"] if self.finetune_steps != 10 else []),
            *(["FT head"] if self.finetune == "head" else []),
        ]
