"""GroupDRO's spec block: `algorithm: {name: groupdro, eta: ...}` (default: FedBR's code,
fedbr/hparams_registry.py `groupdro_eta`; see fedhet.methods.groupdro.algorithm)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.plugin import MethodConfig


class GroupDROConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.groupdro.algorithm:GroupDRO"
    accepts_objectives: ClassVar[bool] = True  # it reweights clients, whatever their loss
    name: Literal["groupdro"] = "groupdro"
    eta: float = Field(
        0.01,
        ge=0,
        le=100,
        description="the step of q's exponentiated-gradient update q_c <- q_c exp(eta l_c); "
        "0 keeps q uniform (FedAvg)",
    )

    def base_label(self) -> str:
        return "GroupDRO" if self.eta == 0.01 else f"GroupDRO (eta {self.eta:g})"
