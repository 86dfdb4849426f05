"""FedRoD's spec block: `algorithm: {name: fedrod}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from fedhet.plugin import OwnModelsConfig


class FedRoDConfig(OwnModelsConfig):
    # each client's own personalized head is evaluated
    trainer: ClassVar[str | None] = "fedhet.methods.fedrod.algorithm:FedRoD"
    name: Literal["fedrod"] = "fedrod"

    def base_label(self) -> str:
        return "FedRoD"
