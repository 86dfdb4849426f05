"""FedProx's spec block: `algorithm: {name: fedprox, mu: ...}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.plugin import MethodConfig


class FedProxConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.fedprox.algorithm:FedProx"
    accepts_objectives: ClassVar[bool] = True
    display_name: ClassVar[str | None] = "FedProx"
    name: Literal["fedprox"] = "fedprox"
    mu: float = Field(0.01, ge=0)
