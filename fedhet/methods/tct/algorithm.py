"""TCT (Train-Convexify-Train) as a fedhet algorithm: its spec block and its three-stage plan.

    bootstrap (a FedAvg `train`, T1 rounds) -> entk (eNTK features) -> regress (stage 2)

The bootstrap node IS the train node of the equivalent plain FedAvg spec (same upstream,
`algorithm: {name: fedavg}`, federation with stage 1's settings), so a FedAvg run of T1
rounds and every TCT spec sharing stage 1 share one artifact. The algorithm object itself
is never trained: TCT's only federated training is that FedAvg run, and stage 2 lives in
the `regress` stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, ValidationError

from fedhet.core.errors import InputError
from fedhet.core.spec import AlgorithmSpec, FederationSpec, Section, Spec, parse_spec
from fedhet.engine.algorithm import Algorithm

if TYPE_CHECKING:
    from fedhet.core.pipeline import StageNode


class Stage1Spec(Section):
    """Stage 1: FedAvg with the spec's federation settings, except what is set here."""

    rounds: int | None = Field(
        None, ge=1, description="T1; default: federation.rounds - stage2.rounds"
    )
    lr: float | None = Field(None, gt=0)
    local_epochs: float | None = Field(None, gt=0)
    local_steps: int | None = Field(None, ge=1)
    batch_size: int | None = Field(None, ge=1)


class EntkSpec(Section):
    """Convexify: eNTK features of the bootstrapped model with its head re-initialized."""

    subsample: int = Field(100_000, gt=0, description="p, the number of eNTK coordinates kept")
    seed: int = Field(0, ge=0, description="seed of the head re-initialization and the mask")
    dtype: Literal["fp16", "fp32"] = "fp16"
    chunk: int = Field(256, ge=1, description="samples per extraction batch and Zarr chunk")


class Stage2Spec(Section):
    """Stage 2: federated least squares on the normalized features (Appendix A)."""

    algorithm: Literal["scaffold", "fedavg", "gd"] = "scaffold"
    rounds: int = Field(100, ge=1, description="T2")
    local_steps: int = Field(500, ge=1, description="M, full-batch steps per round")
    lr: float = Field(5e-5, gt=0, description="eta")


class TCTConfig(AlgorithmSpec):
    name: Literal["tct"] = "tct"
    stage1: Stage1Spec = Stage1Spec()
    entk: EntkSpec = EntkSpec()
    stage2: Stage2Spec = Stage2Spec()

    def base_label(self) -> str:
        variant = self.stage2.algorithm
        return "tct" if variant == "scaffold" else f"tct-{variant}"


def stage1_rounds(spec: Spec, config: TCTConfig) -> int:
    if config.stage1.rounds is not None:
        return config.stage1.rounds
    rounds = spec.federation.rounds - config.stage2.rounds
    if rounds < 1:
        raise InputError(
            f"algorithm.stage1.rounds: unset, so T1 = federation.rounds ({spec.federation.rounds})"
            f" - stage2.rounds ({config.stage2.rounds}) = {rounds}; set stage1.rounds or raise "
            "federation.rounds"
        )
    return rounds


def stage1_federation(spec: Spec, config: TCTConfig) -> FederationSpec:
    """The spec's federation with stage 1's rounds and overrides."""
    overrides = config.stage1.model_dump(exclude_none=True)
    overrides["rounds"] = stage1_rounds(spec, config)
    if "local_steps" in overrides:  # as a plain spec that sets only local_steps would have
        overrides.setdefault("local_epochs", FederationSpec().local_epochs)
    elif "local_epochs" in overrides:
        overrides["local_steps"] = None
    try:
        return FederationSpec.model_validate({**spec.federation.model_dump(), **overrides})
    except ValidationError as err:
        first = err.errors()[0]
        raise InputError(
            f"algorithm.stage1: {first['msg'].removeprefix('Value error, ')}"
        ) from None


def bootstrap_spec(spec: Spec, config: TCTConfig) -> Spec:
    """The plain FedAvg spec whose train stage is TCT's stage 1."""
    data = spec.model_dump(mode="json", exclude={"matrix"})
    data["algorithm"] = {"name": "fedavg"}
    data["federation"] = stage1_federation(spec, config).model_dump(mode="json")
    return parse_spec(data, "tct stage 1")


def check_separable_head(spec: Spec) -> None:
    """TCT re-initializes the last linear layer: there must be layers with parameters before it."""
    if spec.model.arch == "mlp" and not spec.model.hidden:
        raise InputError(
            "model.hidden: [] makes the model a single linear layer, so TCT has no features to "
            "keep when it re-initializes that layer; give the mlp hidden layers"
        )


class TCT(Algorithm):
    name = "tct"
    Config = TCTConfig

    @classmethod
    def plan(cls, spec: Spec) -> StageNode:
        from fedhet.engine.train_stage import train_node
        from fedhet.methods.tct.entk_stage import entk_node
        from fedhet.methods.tct.regress_stage import regress_node

        config = spec.algorithm
        assert isinstance(config, TCTConfig)
        check_separable_head(spec)
        stage1 = bootstrap_spec(spec, config)
        bootstrap = train_node(stage1)
        bootstrap.spec = stage1
        return regress_node(entk_node(bootstrap, config.entk), config.stage2)
