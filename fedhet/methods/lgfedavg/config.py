"""LG-FedAvg's spec block: `algorithm: {name: lgfedavg, global_layers: 1}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from fedhet.plugin import LayerSplitConfig, layers_from_output


class LGFedAvgConfig(LayerSplitConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.lgfedavg.algorithm:LGFedAvg"
    split_field: ClassVar[str] = "global_layers"
    display_name: ClassVar[str | None] = "LG-FedAvg"
    name: Literal["lgfedavg"] = "lgfedavg"
    global_layers: int = layers_from_output(
        1,
        "layers averaged by the server, counted from the output (1: the head); "
        "the layers below them stay on each client",
    )

    def settings(self) -> list[str]:
        return [f"global layers={self.global_layers}"] if self.global_layers != 1 else []
