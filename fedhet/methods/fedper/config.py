"""FedPer's spec block: `algorithm: {name: fedper, personal_layers: 1}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.plugin import MAX_LAYERS, InputError, MethodConfig, layer_split_problem


class FedPerConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.fedper.algorithm:FedPer"
    personalized: ClassVar[bool] = True  # each client's own personal layers are evaluated
    keeps_momentum_buffers: ClassVar[bool] = False  # clients' states are model layers
    display_name: ClassVar[str | None] = "FedPer"
    name: Literal["fedper"] = "fedper"
    personal_layers: int = Field(
        1,
        ge=0,
        le=MAX_LAYERS,
        description="layers kept on each client, counted from the output (1: the head)",
    )

    def check(self, spec) -> None:
        super().check(spec)
        problem = layer_split_problem(spec.model, self.personal_layers)
        if problem:
            raise InputError(f"algorithm.personal_layers: {self.personal_layers} {problem}")

    def settings(self) -> list[str]:
        return [f"personal layers={self.personal_layers}"] if self.personal_layers != 1 else []
