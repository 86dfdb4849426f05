"""FedRep's spec block: `algorithm: {name: fedrep, personal_layers: 1, head_epochs: 9}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.plugin import MAX_LAYERS, InputError, MethodConfig, layer_split_problem


class FedRepConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.fedrep.algorithm:FedRep"
    personalized: ClassVar[bool] = True  # each client's own head is evaluated
    keeps_momentum_buffers: ClassVar[bool] = False  # clients' states are model layers
    display_name: ClassVar[str | None] = "FedRep"
    name: Literal["fedrep"] = "fedrep"
    personal_layers: int = Field(
        1,
        ge=1,
        le=MAX_LAYERS,
        description="the head: layers kept on each client, counted from the output",
    )
    head_epochs: float = Field(
        9,
        gt=0,
        le=1000,
        description="epochs of the client's data the head trains for (body frozen) before "
        "the body's local work (head frozen)",
    )

    def check(self, spec) -> None:
        super().check(spec)
        problem = layer_split_problem(spec.model, self.personal_layers)
        if problem:
            raise InputError(f"algorithm.personal_layers: {self.personal_layers} {problem}")
