"""APFL's spec block: `algorithm: {name: apfl, alpha: 0.5, adaptive: true}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.plugin import OwnModelsConfig


class APFLConfig(OwnModelsConfig):
    # each client's mixture alpha v + (1 - alpha) w is what is evaluated (and stored with the run)
    trainer: ClassVar[str | None] = "fedhet.methods.apfl.algorithm:APFL"
    display_name: ClassVar[str | None] = "APFL"
    name: Literal["apfl"] = "apfl"
    alpha: float = Field(
        0.5, ge=0, le=1, description="each client's mixing weight of its local model, at the start"
    )
    adaptive: bool = Field(
        True, description="learn each client's alpha by gradient steps (clipped to [0, 1])"
    )

    def settings(self) -> list[str]:
        return [] if self.adaptive else [f"alpha={self.alpha:g}"]
