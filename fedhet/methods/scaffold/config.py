"""SCAFFOLD's spec block: `algorithm: {name: scaffold, correction: ...}`."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from fedhet.plugin import OMIT_IF_DEFAULT, MethodConfig


class ScaffoldConfig(MethodConfig):
    revision: ClassVar[int] = 1  # 1: momentum-aware control variates
    trainer: ClassVar[str | None] = "fedhet.methods.scaffold.algorithm:Scaffold"
    accepts_objectives: ClassVar[bool] = True
    display_name: ClassVar[str | None] = "SCAFFOLD"
    name: Literal["scaffold"] = "scaffold"
    correction: Annotated[Literal["gradient", "after_step"], OMIT_IF_DEFAULT] = Field(
        "gradient",
        description="gradient: c - c_i added to the gradient before the step (momentum-aware "
        "c_i); after_step: param -= lr (c - c_i) after the step, as the authors' code",
    )

    def settings(self) -> list[str]:
        return ["after step"] if self.correction == "after_step" else []
