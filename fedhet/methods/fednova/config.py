"""FedNova's spec block: `algorithm: {name: fednova}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from fedhet.core.sections import AlgorithmSpec


class FedNovaConfig(AlgorithmSpec):
    accepts_objectives: ClassVar[bool] = True
    name: Literal["fednova"] = "fednova"
