"""DANN's spec block: `algorithm: {name: dann, lam: ..., schedule: ...}` (defaults: FedBR's
code, fedbr/hparams_registry.py and fedbr/networks.py MLP; see fedhet.methods.dann.algorithm)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.plugin import (
    MAX_COUNT,
    InputError,
    LearningRate,
    MethodConfig,
    Spec,
    Weight,
    Width,
)


class DANNConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.dann.algorithm:DANN"
    keeps_momentum_buffers: ClassVar[bool] = False  # two optimizers of its own each round
    display_name: ClassVar[str | None] = "DANN"
    name: Literal["dann"] = "dann"
    lam: Weight = Field(
        0.01,
        description="lambda: weight of the domain loss the features ascend (the gradient "
        "reversal's scale); 0 leaves the features and classifier FedAvg's",
    )
    schedule: Literal["alternate", "joint"] = Field(
        "alternate",
        description="alternate: each local step trains the domain classifier alone or the "
        "features and classifier alone, by the client's update count (FedBR's code); joint: "
        "both at every step through the reversal layer (Ganin et al.)",
    )
    d_steps_per_g: int = Field(
        1,
        ge=0,
        le=MAX_COUNT,
        description="alternate: domain-classifier steps per feature/classifier step",
    )
    disc_width: Width = Field(256, description="the 3-layer MLP's width")
    disc_lr: LearningRate | None = Field(
        None, description="the domain classifier's SGD lr; default the round's client lr"
    )
    disc_weight_decay: Weight = Field(0.0, description="the domain classifier's SGD's")

    def check(self, spec: Spec) -> None:
        super().check(spec)
        if self.schedule == "joint" and self.d_steps_per_g != 1:
            raise InputError(
                "algorithm.d_steps_per_g: counts the steps of schedule: alternate, which "
                "schedule: joint replaces; remove it"
            )
        if spec.partition.clients < 2:
            raise InputError(
                "algorithm.name: dann tells clients apart (one domain per client); "
                "partition.clients must be at least 2"
            )

    def settings(self) -> list[str]:
        settings = [f"lambda={self.lam:g}"] if self.lam != 0.01 else []
        if self.schedule == "joint":
            settings.append("joint")
        elif self.d_steps_per_g != 1:
            settings.append(f"{self.d_steps_per_g} D steps per G")
        return settings
