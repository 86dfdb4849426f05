"""MOON's spec block: `algorithm: {name: moon, mu: ..., temperature: ..., projection: ...}`."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from fedhet.plugin import OMIT_IF_DEFAULT, MethodConfig, Weight, Width


class MoonConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.moon.algorithm:Moon"
    display_name: ClassVar[str | None] = "MOON"
    name: Literal["moon"] = "moon"
    mu: Weight = Field(
        1.0,
        description="weight of the model-contrastive term (official code's default 1; the paper "
        "tunes it in {0.1, 1, 5, 10}; FedBR's baseline hard-codes 0.01)",
    )
    temperature: float = Field(
        0.5, gt=0, description="tau of the contrastive term (paper and official code: 0.5)"
    )
    projection: Annotated[Literal["mlp", "none"], OMIT_IF_DEFAULT] = Field(
        "mlp",
        description="mlp: a projection head between the model's features and its classifier, "
        "whose output is the representation (the paper, FedBR's baseline); none: the model "
        "unchanged, the representation its penultimate features",
    )
    projection_width: Annotated[Width, OMIT_IF_DEFAULT] = Field(
        256, description="hidden width of the projection head (FedBR's 256)"
    )

    def settings(self) -> list[str]:
        return ["no projection"] if self.projection == "none" else []
