"""GroupDRO's spec block: `algorithm: {name: groupdro, eta: ...}` (default: FedBR's code,
fedbr/hparams_registry.py `groupdro_eta`; see fedhet.methods.groupdro.algorithm)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from fedhet.plugin import OMIT_IF_DEFAULT, InputError, MethodConfig, MixupAlpha, Spec


class GroupDROConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.groupdro.algorithm:GroupDRO"
    accepts_objectives: ClassVar[bool] = True  # it reweights clients, whatever their loss
    display_name: ClassVar[str | None] = "GroupDRO"
    name: Literal["groupdro"] = "groupdro"
    eta: float = Field(
        0.01,
        ge=0,
        le=100,
        description="the step of q's exponentiated-gradient update q_c <- q_c exp(eta l_c); "
        "0 keeps q uniform (FedAvg)",
    )
    mixup_alpha: Annotated[MixupAlpha | None, OMIT_IF_DEFAULT] = Field(
        None,
        description="mix each local batch with itself, lambda ~ Beta(alpha, alpha), as FedBR's "
        "code's GroupDRO always does (with 0.2); default: no mixing (the paper's GroupDRO)",
    )

    def check(self, spec: Spec) -> None:
        super().check(spec)
        if self.mixup_alpha is not None and self.objectives():
            raise InputError(
                "algorithm.mixup_alpha: mixup replaces the local objective, as the objective "
                "wrapper set beside it does; set only one"
            )

    def trainer_class(self) -> type[Any]:
        """GroupDRO, or with `mixup_alpha` its clients-mix-their-batches variant."""
        trainer = super().trainer_class()
        return trainer if self.mixup_alpha is None else trainer.mixing

    def settings(self) -> list[str]:
        return [
            *([f"eta={self.eta:g}"] if self.eta != 0.01 else []),
            *([f"mixup={self.mixup_alpha:g}"] if self.mixup_alpha is not None else []),
        ]
