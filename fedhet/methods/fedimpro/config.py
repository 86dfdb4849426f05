"""FedImpro's spec block: `algorithm: {name: fedimpro, split: ..., ...}`."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from fedhet.plugin import OMIT_IF_DEFAULT, Count, InputError, MethodConfig, Momentum, Weight

Objective = Literal["official", "mixture"]
Source = Literal["global", "client"]


class FedImproConfig(MethodConfig):
    # 1: the authors' objective, ramp and std clip as defaults (objective, ramp, std_clip)
    # 2: the authors' ramp in absolute rounds as default (ramp_rounds 500, not half the run)
    revision: ClassVar[int] = 2
    trainer: ClassVar[str | None] = "fedhet.methods.fedimpro.algorithm:FedImpro"
    display_name: ClassVar[str | None] = "FedImpro"
    name: Literal["fedimpro"] = "fedimpro"
    split: str | None = Field(
        None,
        description="split point, a stage of the model's feature extractor (`fedhet spec show` "
        "lists them); default: the middle one (ResNet: layer2, as the paper; simple_cnn: conv2, "
        "after the conv layers; mlp: hidden1)",
    )
    momentum: Momentum = Field(
        0.9,
        description="moving-average momentum of the client statistics (Eq. 7); 0 replaces "
        "them with each batch's (the authors' code); unused with rate_samples",
    )
    rate_samples: Count | None = Field(
        None,
        description="instead of momentum, class c moves by min(1, n_c / rate_samples) per step, "
        "n_c its samples in the batch; null: by 1 - momentum",
    )
    sample_from: Source = Field(
        "global",
        description="statistics the sampled features come from: global (received this round) "
        "or client (the client's running ones, starting from the global: the authors' code)",
    )
    samples: Count | None = Field(
        None,
        description="N_hat, sampled features per local step; default: the batch size",
    )
    objective: Objective = Field(
        "official",
        description="official: CE(real) + w CE(sampled) (the authors' experiments); mixture: "
        "Theorem 4.2's sample-weighted mixture, low-level gradient of the plain CE",
    )
    weight: Weight = Field(
        1.0, description="weight w of the sampled features (at the ramp's end); 0 is FedAvg"
    )
    ramp_rounds: Count | None = Field(
        500,
        description="w_t = w t / R at round t rises linearly, uncapped (the authors' schedule); "
        "R in rounds (the authors' code: 500); null: R from `ramp`",
    )
    ramp: float | None = Field(
        None,
        ge=0,
        description="R as a fraction of the run's rounds instead (0 keeps w constant); giving "
        "it makes ramp_rounds null",
    )
    ramp_cap: Annotated[bool, OMIT_IF_DEFAULT] = Field(
        False,
        description="true: w_t = w min(1, t / R), the ramp held at w once it gets there (Eq. 6's "
        "constant weight after a warm-up); false: uncapped, as the authors' code",
    )
    noise_std: float = Field(
        0.0, ge=0, description="std of Gaussian noise on the uploaded statistics (Table 7)"
    )
    std_clip: float | None = Field(
        0.1, gt=0, description="cap on the sampling std (the authors' code: 0.1); null: none"
    )

    @model_validator(mode="before")
    @classmethod
    def _one_ramp(cls, data: Any) -> Any:
        """`ramp` replaces the default `ramp_rounds`; exactly one of the two is set."""
        if not isinstance(data, dict):
            return data
        ramp, rounds = data.get("ramp"), data.get("ramp_rounds", 500)
        if ramp is not None and "ramp_rounds" not in data:
            return {**data, "ramp_rounds": None}
        if ramp is not None and rounds is not None:
            raise ValueError("give either ramp (a fraction of the run) or ramp_rounds, not both")
        if ramp is None and rounds is None:
            raise ValueError("ramp_rounds is null: give ramp (a fraction of the run) instead")
        return data

    @model_validator(mode="after")
    def _one_rate(self) -> FedImproConfig:
        """rate_samples replaces momentum; its default, which `spec show` fills in, may stay."""
        default = type(self).model_fields["momentum"].default
        if self.rate_samples is not None and self.momentum != default:
            raise ValueError("give either momentum or rate_samples (the statistics' rate)")
        return self

    def ramp_length(self, rounds: int) -> float:
        """R of w_t = w t / R for a run of `rounds` rounds; 0: w constant."""
        return self.ramp_rounds if self.ramp_rounds is not None else self.ramp * rounds

    def extendable(self, spec, rounds: int) -> bool:
        """The ramp as a fraction of the run (`ramp`) depends on the run's total rounds."""
        ramp_fixed = self.ramp_rounds is not None or self.ramp == 0 or self.weight == 0
        return ramp_fixed and super().extendable(spec, rounds)

    def check(self, spec) -> None:
        super().check(spec)
        resolve_split(spec.model.split_points(), self.split)
        if self.weight == 0 and self.sample_from != "global":
            raise InputError(
                "algorithm.sample_from: weight 0 samples no features; remove it or set weight"
            )

    def settings(self) -> list[str]:
        options = [
            f"split={self.split}" if self.split else "",
            self.objective if self.objective != "official" else "",
            f"w={self.weight}" if self.weight != 1 else "",
            f"ramp={self.ramp}" if self.ramp is not None else "",
            f"ramp={self.ramp_rounds}r" if self.ramp_rounds not in (None, 500) else "",
            "capped" if self.ramp_cap else "",
            f"rate=n/{self.rate_samples}" if self.rate_samples else "",
            f"momentum={self.momentum}" if self.momentum != 0.9 else "",
            "sample=client" if self.sample_from == "client" else "",
            f"clip={self.std_clip}" if self.std_clip != 0.1 else "",
            f"noise={self.noise_std}" if self.noise_std > 0 else "",
        ]
        return [o for o in options if o]


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
