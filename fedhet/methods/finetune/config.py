"""FedAvg-FT's spec block: `algorithm: {name: finetune, finetune_steps: 10}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.plugin import MAX_COUNT, MethodConfig


class FineTuneConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.finetune.algorithm:FineTune"
    # each client's model is the global one fine-tuned on its data, at every evaluation
    personalized: ClassVar[bool] = True
    display_name: ClassVar[str | None] = "FedAvg-FT"
    name: Literal["finetune"] = "finetune"
    finetune_steps: int = Field(
        10, ge=0, le=MAX_COUNT, description="local SGD steps of fine-tuning at evaluation"
    )
    finetune_lr: float | None = Field(
        None, gt=0, description="the fine-tuning learning rate; default: federation.lr"
    )

    def settings(self) -> list[str]:
        return [f"FT steps={self.finetune_steps}"] if self.finetune_steps != 10 else []
