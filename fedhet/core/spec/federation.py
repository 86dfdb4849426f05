"""The `federation:` section: rounds, participation, local work and the clients' optimizer."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from fedhet.core.sections import (
    OMIT_IF_DEFAULT,
    Clients,
    Count,
    Epochs,
    LearningRate,
    Momentum,
    Section,
    Weight,
)
from fedhet.core.system_spec import SystemSpec, absent_when_default


class FederationSpec(Section):
    rounds: Count = 30
    clients_per_round: Clients | None = Field(None, description="default: all clients")
    fraction: float | None = Field(None, gt=0, le=1, description="alternative to clients_per_round")
    local_epochs: Epochs | None = 1
    local_steps: Count | None = Field(None, description="fixed local steps; replaces epochs")
    batch_size: Count = 32
    lr: LearningRate = 0.05
    lr_decay: float = Field(
        1.0, gt=0, le=1, description="learning rate multiplied by this per round"
    )
    momentum: Momentum = 0.0
    momentum_buffers: Annotated[Literal["reset", "client"], OMIT_IF_DEFAULT] = Field(
        "reset",
        description="reset: every round's local optimizer starts with an empty momentum buffer; "
        "client: each client keeps its buffer across rounds (in its state, checkpointed)",
    )
    weight_decay: Weight = 0.0
    system: Annotated[SystemSpec | None, OMIT_IF_DEFAULT, AfterValidator(absent_when_default)] = (
        Field(None, description="system heterogeneity: local work, availability, stragglers")
    )

    @model_validator(mode="after")
    def _one_participation_and_one_duration(self) -> FederationSpec:
        if self.clients_per_round is not None and self.fraction is not None:
            raise ValueError("set either clients_per_round or fraction, not both")
        if self.local_steps is not None and self.local_epochs not in (None, 1):
            raise ValueError("set either local_epochs or local_steps, not both")
        if self.system is not None and self.system.sets_local_work():
            if self.local_steps is not None or self.local_epochs not in (None, 1):
                raise ValueError(
                    "system.local_epochs/local_steps replace federation's; set the local work "
                    "in one place"
                )
        if self.local_steps is None and self.local_epochs is None:
            raise ValueError("set local_epochs or local_steps to say how long clients train")
        return self
