"""LG-FedAvg's spec block: `algorithm: {name: lgfedavg, global_layers: 1}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.plugin import MAX_LAYERS, InputError, MethodConfig, layer_split_problem


class LGFedAvgConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.lgfedavg.algorithm:LGFedAvg"
    personalized: ClassVar[bool] = True  # each client's own representation layers are evaluated
    keeps_momentum_buffers: ClassVar[bool] = False  # clients' states are model layers
    display_name: ClassVar[str | None] = "LG-FedAvg"
    name: Literal["lgfedavg"] = "lgfedavg"
    global_layers: int = Field(
        1,
        ge=1,
        le=MAX_LAYERS,
        description="layers averaged by the server, counted from the output (1: the head); "
        "the layers below them stay on each client",
    )

    def check(self, spec) -> None:
        super().check(spec)
        problem = layer_split_problem(spec.model, self.global_layers)
        if problem:
            raise InputError(f"algorithm.global_layers: {self.global_layers} {problem}")

    def settings(self) -> list[str]:
        return [f"global layers={self.global_layers}"] if self.global_layers != 1 else []
