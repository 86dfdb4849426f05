"""pFedMe's spec block: `algorithm: {name: pfedme, lam: 15, inner_steps: 5, ...}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.plugin import Count, InputError, LearningRate, OwnModelsConfig, Weight


class PFedMeConfig(OwnModelsConfig):
    # each client's personalized model theta is what is evaluated (and stored with the run)
    trainer: ClassVar[str | None] = "fedhet.methods.pfedme.algorithm:PFedMe"
    display_name: ClassVar[str | None] = "pFedMe"
    name: Literal["pfedme"] = "pfedme"
    lam: Weight = Field(15.0, description="lambda: the Moreau envelope's pull of theta towards w")
    inner_steps: Count = Field(5, description="K: gradient steps solving each inner problem")
    personal_lr: LearningRate = Field(
        0.09,
        description="the inner problem's step size (the official personal_learning_rate)",
    )
    beta: float = Field(
        1.0, gt=0, description="server mixing: (1 - beta) previous global + beta average"
    )

    def check(self, spec) -> None:
        super().check(spec)
        if self.client_momentum(spec.federation) > 0:
            raise InputError(
                "federation.momentum: pfedme's steps are the paper's plain gradient steps; "
                "set algorithm.local_momentum: 0"
            )
