"""FedNova's spec block: `algorithm: {name: fednova}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from fedhet.plugin import MethodConfig


class FedNovaConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.fednova.algorithm:FedNova"
    accepts_objectives: ClassVar[bool] = True
    display_name: ClassVar[str | None] = "FedNova"
    name: Literal["fednova"] = "fednova"
