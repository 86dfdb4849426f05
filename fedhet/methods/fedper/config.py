"""FedPer's spec block: `algorithm: {name: fedper, personal_layers: 1}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from fedhet.plugin import LayerSplitConfig, layers_from_output


class FedPerConfig(LayerSplitConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.fedper.algorithm:FedPer"
    display_name: ClassVar[str | None] = "FedPer"
    name: Literal["fedper"] = "fedper"
    personal_layers: int = layers_from_output(
        0, "layers kept on each client, counted from the output (1: the head)"
    )

    def settings(self) -> list[str]:
        return [f"personal layers={self.personal_layers}"] if self.personal_layers != 1 else []
