"""FedMix's spec block: `algorithm: {name: fedmix, lam: ..., mean_size: ..., derivative: ...}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.plugin import Count, MethodConfig, Share


class FedMixConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.fedmix.algorithm:FedMix"
    display_name: ClassVar[str | None] = "FedMix"
    name: Literal["fedmix"] = "fedmix"
    lam: Share = Field(0.1, description="lambda, the weight of the other clients' means (0.1)")
    mean_size: Count = Field(10, description="M: the samples averaged into each shared mean (10)")
    derivative: Literal["batch_mean", "sample"] = Field(
        "batch_mean",
        description="the Taylor term's dl/dx: of the batch's mean first term (the official "
        "code: the term carries 1/batch size) or of each sample's own first term",
    )

    def input_steps(self) -> str | None:
        return "mixes two samples' inputs"

    def settings(self) -> list[str]:
        mean = [f"lambda={self.lam:g}", f"M={self.mean_size}"]
        return [
            *(mean if (self.lam, self.mean_size) != (0.1, 10) else []),
            *(["per-sample dl/dx"] if self.derivative == "sample" else []),
        ]
