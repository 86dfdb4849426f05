"""FedProx's spec block: `algorithm: {name: fedprox, mu: ...}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from fedhet.plugin import MethodConfig, Weight


class FedProxConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.fedprox.algorithm:FedProx"
    accepts_objectives: ClassVar[bool] = True
    display_name: ClassVar[str | None] = "FedProx"
    name: Literal["fedprox"] = "fedprox"
    mu: Weight = 0.01
