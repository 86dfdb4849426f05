"""Ditto's spec block: `algorithm: {name: ditto, lam: 0.1}`."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from fedhet.plugin import OMIT_IF_DEFAULT, LearningRate, OwnModelsConfig, Weight


class DittoConfig(OwnModelsConfig):
    # each client's personal model is what is evaluated (and stored with the run)
    trainer: ClassVar[str | None] = "fedhet.methods.ditto.algorithm:Ditto"
    display_name: ClassVar[str | None] = "Ditto"
    name: Literal["ditto"] = "ditto"
    lam: Weight = Field(
        0.1,
        description="lambda: pull of each personal model towards the global one (0: local)",
    )
    personal_lr: Annotated[LearningRate | None, OMIT_IF_DEFAULT] = Field(
        None,
        description="the personal model's step size, decayed as federation.lr; default: the "
        "round's lr (the official code's one learning rate)",
    )
