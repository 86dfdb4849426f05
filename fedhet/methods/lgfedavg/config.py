"""LG-FedAvg's spec block: `algorithm: {name: lgfedavg, global_layers: 1}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from fedhet.plugin import LayerSplitConfig, layers_from_output


class LGFedAvgConfig(LayerSplitConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.lgfedavg.algorithm:LGFedAvg"
    split_field: ClassVar[str] = "global_layers"
    name: Literal["lgfedavg"] = "lgfedavg"
    global_layers: int = layers_from_output(
        1,
        "layers averaged by the server, counted from the output (1: the head); "
        "the layers below them stay on each client",
    )

    def base_label(self) -> str:
        return f"LG-FedAvg ({self.global_layers} global)"
