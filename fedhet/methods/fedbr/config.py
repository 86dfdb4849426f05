"""FedBR's spec block: `algorithm: {name: fedbr, pseudo: {...}, ...}`, its pseudo-data's, and its
plan (the train stage, with the `pseudo` stage upstream)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from fedhet.plugin import (
    MAX_COUNT,
    OMIT_IF_DEFAULT,
    Count,
    DatasetName,
    InputError,
    MethodConfig,
    MixupAlpha,
    Section,
    Spec,
    StageNode,
    Weight,
    Width,
    partition_node,
    train_node,
)


class PseudoSpec(Section):
    """How FedBR's pseudo-data is built and shared."""

    kind: Literal["rsm", "mixture"] = "rsm"
    size: Count | None = Field(
        None,
        description="pseudo samples; default one batch (federation.batch_size)",
    )
    subset: Count = Field(10, description="samples averaged into one RSM sample")
    proxy: DatasetName = Field("digits", description="mixture: the proxy dataset")
    mix: int = Field(
        1, ge=0, le=MAX_COUNT, description="mixture: K local samples mixed into each (Eq. 4)"
    )
    refresh: Literal["once", "round"] = Field(
        "once", description="once: sent at the start; round: regenerated every round"
    )


PSEUDO_VERSION = 1  # the `pseudo` stage's format (computed by fedhet.methods.fedbr.pseudo_stage)


def pseudo_config(pseudo: PseudoSpec, spec: Spec) -> dict:
    """What determines the stored batch (mixing and refresh happen later, on the clients)."""
    config = {
        "kind": pseudo.kind,
        "size": pseudo.size or spec.federation.batch_size,
        "subset": pseudo.subset,
        "seed": spec.seed,
    }
    if pseudo.kind == "mixture":
        config |= {"proxy": pseudo.proxy, "dataset": spec.data.dataset}
    if spec.data.input_format():
        config["input_format"] = spec.data.input_format()
    return config


def pseudo_node(pseudo: PseudoSpec, spec: Spec) -> StageNode:
    config = pseudo_config(pseudo, spec)
    upstream = {"partition": partition_node(spec)} if pseudo.kind == "rsm" else {}
    return StageNode("pseudo", PSEUDO_VERSION, config, upstream)


# The components on (debias_classifier, debias_features): the label's first setting
_VARIANTS = {
    (True, True): "",
    (True, False): "component 1",
    (False, True): "component 2",
    (False, False): "without components",
}


class FedBRConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.fedbr.algorithm:FedBR"
    keeps_momentum_buffers: ClassVar[bool] = False  # two optimizers of its own each round
    display_name: ClassVar[str | None] = "FedBR"
    name: Literal["fedbr"] = "fedbr"
    pseudo: PseudoSpec = PseudoSpec()
    debias_classifier: bool = Field(True, description="component 1: CE(pseudo, uniform)")
    debias_features: bool = Field(True, description="component 2: adversarial L_con")
    max_step: bool = Field(True, description="component 2's max step (ablation: false)")
    lam: Weight = Field(1.0, description="lambda, weight of the pseudo-data CE")
    mu: Weight = Field(0.5, description="weight of L_con")
    tau1: float = Field(2.0, gt=0, description="L_con temperature of the positive pair (Eq. 5)")
    tau2: float = Field(2.0, gt=0, description="L_con temperature of the negative pairs (Eq. 6)")
    pairing: Annotated[Literal["all", "index"], OMIT_IF_DEFAULT] = Field(
        "all",
        description="L_con's negative pairs: all = every (pseudo, real) pair (the expectation "
        "of Eq. 2-3); index = pseudo sample i with real sample i (the official code)",
    )
    projection_width: Width = 256
    projection_dim: Width = 128
    mixup: Annotated[MixupAlpha | None, OMIT_IF_DEFAULT] = Field(
        None,
        description="FedBR + Mixup: the real batch mixed with itself at each local step, "
        "lambda ~ Beta(mixup, mixup) (the official code: 0.2); default off",
    )

    @property
    def uses_pseudo(self) -> bool:
        return self.debias_classifier or self.debias_features

    def input_steps(self) -> str | None:
        return "trains on pseudo-data mixed from its inputs" if self.uses_pseudo else None

    def check(self, spec: Spec) -> None:
        super().check(spec)
        if self.pairing != "all" and not self.debias_features:
            raise InputError(
                "algorithm.pairing: pairs the samples of L_con, which debias_features: false "
                "turns off; remove it"
            )

    def plan(self, spec: Spec) -> StageNode:
        """The train node, with the pseudo batch upstream when a component uses it."""
        if not self.uses_pseudo:
            return train_node(spec)
        return train_node(spec, pseudo=pseudo_node(self.pseudo, spec))

    def settings(self) -> list[str]:
        options = [
            _VARIANTS[self.debias_classifier, self.debias_features],
            "w/o max step" if self.debias_features and not self.max_step else "",
            "mixture" if self.uses_pseudo and self.pseudo.kind == "mixture" else "",
            "pseudo-data each round" if self.uses_pseudo and self.pseudo.refresh == "round" else "",
            f"tau={self.tau1:g}/{self.tau2:g}"
            if self.debias_features and (self.tau1, self.tau2) != (2.0, 2.0)
            else "",
            "index pairs" if self.debias_features and self.pairing == "index" else "",
            "mixup" if self.mixup == 0.2 else f"mixup={self.mixup:g}" if self.mixup else "",
        ]
        return [o for o in options if o]
