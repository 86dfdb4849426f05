"""Per-FedAvg's spec block: `algorithm: {name: perfedavg, variant: fo, alpha: 0.01}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.plugin import LearningRate, MethodConfig


class PerFedAvgConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.perfedavg.algorithm:PerFedAvg"
    # each client's model is the global one adapted by a step on its data: evaluated per client
    personalized: ClassVar[bool] = True
    # 1: each client's model scored on its own validation and test samples, not the pooled
    # sets (fedhet.engine.own_evaluation)
    revision: ClassVar[int] = 1
    keeps_momentum_buffers: ClassVar[bool] = False  # its local steps are meta-steps
    display_name: ClassVar[str | None] = "Per-FedAvg"
    name: Literal["perfedavg"] = "perfedavg"
    variant: Literal["fo", "hf"] = Field(
        "fo", description="fo: first-order (2 batches a step); hf: Hessian-free (3 batches)"
    )
    alpha: LearningRate = Field(
        0.01, description="the adaptation step size (inside each step and at evaluation)"
    )
    delta: float = Field(
        0.001, gt=0, description="hf: the finite difference of the Hessian-vector product"
    )

    def settings(self) -> list[str]:
        return [self.variant.upper()] if self.variant != "fo" else []
