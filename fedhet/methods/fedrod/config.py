"""FedRoD's spec block: `algorithm: {name: fedrod}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from fedhet.plugin import OwnModelsConfig


class FedRoDConfig(OwnModelsConfig):
    # each client's own personalized head is evaluated
    trainer: ClassVar[str | None] = "fedhet.methods.fedrod.algorithm:FedRoD"
    display_name: ClassVar[str | None] = "FedRoD"
    name: Literal["fedrod"] = "fedrod"
