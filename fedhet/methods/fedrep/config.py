"""FedRep's spec block: `algorithm: {name: fedrep, personal_layers: 1, head_epochs: 9}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.plugin import LayerSplitConfig, layers_from_output


class FedRepConfig(LayerSplitConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.fedrep.algorithm:FedRep"
    display_name: ClassVar[str | None] = "FedRep"
    name: Literal["fedrep"] = "fedrep"
    personal_layers: int = layers_from_output(
        1, "the head: layers kept on each client, counted from the output"
    )
    head_epochs: float = Field(
        9,
        gt=0,
        le=1000,
        description="epochs of the client's data the head trains for (body frozen) before "
        "the body's local work (head frozen)",
    )
