"""FedImpro's spec block: `algorithm: {name: fedimpro, split: ..., ...}`."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.core.errors import InputError
from fedhet.core.sections import MAX_COUNT
from fedhet.engine.description import MethodConfig

Objective = Literal["official", "mixture"]


class FedImproConfig(MethodConfig):
    # 1: the authors' objective, ramp and std clip as defaults (objective, ramp, std_clip)
    revision: ClassVar[int] = 1
    trainer: ClassVar[str | None] = "fedhet.methods.fedimpro.algorithm:FedImpro"
    name: Literal["fedimpro"] = "fedimpro"
    split: str | None = Field(
        None,
        description="split point, a stage of the model's feature extractor (`fedhet spec show` "
        "lists them); default: the middle one (ResNet: layer2, as the paper; simple_cnn: conv2, "
        "after the conv layers; mlp: hidden1)",
    )
    momentum: float = Field(
        0.9, ge=0, lt=1, description="moving-average momentum of the client statistics (Eq. 7)"
    )
    samples: int | None = Field(
        None,
        ge=1,
        le=MAX_COUNT,
        description="N_hat, sampled features per local step; default: the batch size",
    )
    objective: Objective = Field(
        "official",
        description="official: CE(real) + w CE(sampled) (the authors' experiments); mixture: "
        "Theorem 4.2's sample-weighted mixture, low-level gradient of the plain CE",
    )
    weight: float = Field(
        1.0, ge=0, description="weight w of the sampled features (at the ramp's end); 0 is FedAvg"
    )
    ramp: float = Field(
        0.5,
        ge=0,
        description="w_t = w t / R rises linearly (uncapped, as the authors' schedule) and "
        "reaches w after this fraction R of the run's rounds; 0 keeps w constant",
    )
    ramp_rounds: int | None = Field(
        None,
        ge=1,
        le=MAX_COUNT,
        description="R in rounds instead of a fraction (the authors' code: 500)",
    )
    noise_std: float = Field(
        0.0, ge=0, description="std of Gaussian noise on the uploaded statistics (Table 7)"
    )
    std_clip: float | None = Field(
        0.1, gt=0, description="cap on the sampling std (the authors' code: 0.1); null: none"
    )

    def extendable(self, spec, rounds: int) -> bool:
        """The ramp as a fraction of the run (`ramp`, without `ramp_rounds`) depends on the
        run's total rounds."""
        ramp_fixed = self.ramp_rounds is not None or self.ramp == 0 or self.weight == 0
        return ramp_fixed and super().extendable(spec, rounds)

    def check(self, spec) -> None:
        super().check(spec)
        resolve_split(spec.model.split_points(), self.split)

    def base_label(self) -> str:
        label = self.name + (f"@{self.split}" if self.split else "")
        options = [
            self.objective if self.objective != "official" else "",
            f"w={self.weight}" if self.weight != 1 else "",
            f"ramp={self.ramp_rounds or self.ramp}" if self.ramp_rounds or self.ramp != 0.5 else "",
            f"clip={self.std_clip}" if self.std_clip != 0.1 else "",
            f"noise={self.noise_std}" if self.noise_std > 0 else "",
        ]
        options = [o for o in options if o]
        return label + (f"({', '.join(options)})" if options else "")


def resolve_split(points: list[str] | tuple[str, ...], split: str | None) -> str:
    """The configured split point, or the middle one; InputError naming the valid ones."""
    if split is None:
        return points[(len(points) - 1) // 2]
    if split not in points:
        raise InputError(
            f"algorithm.split: {split!r} is not a split point of this model; "
            f"choose one of {list(points)}"
        )
    return split
