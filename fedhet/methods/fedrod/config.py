"""FedRoD's spec block: `algorithm: {name: fedrod}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from fedhet.plugin import MethodConfig


class FedRoDConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.fedrod.algorithm:FedRoD"
    personalized: ClassVar[bool] = True  # each client's own personalized head is evaluated
    keeps_momentum_buffers: ClassVar[bool] = False  # clients' states are model layers
    display_name: ClassVar[str | None] = "FedRoD"
    name: Literal["fedrod"] = "fedrod"
