"""TCT's spec block: `algorithm: {name: tct, stage1: ..., entk: ..., stage2: ...}`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, ClassVar, Literal

from pydantic import Field

from fedhet.core.errors import InputError
from fedhet.core.sections import MAX_COUNT, MAX_SEED, OMIT_IF_DEFAULT, Section
from fedhet.engine.description import MethodConfig, ModelChoice
from fedhet.engine.train_plan import train_node
from fedhet.methods.tct.plan import bootstrap_spec, entk_node, regress_node

if TYPE_CHECKING:
    import zarr

    from fedhet.core.pipeline import RunContext, StageNode
    from fedhet.core.spec import Spec
    from fedhet.metrics.accuracy import Scores


class Stage1Spec(Section):
    """Stage 1: FedAvg with the spec's federation settings, except what is set here."""

    rounds: int | None = Field(
        None, ge=1, le=MAX_COUNT, description="T1; default: federation.rounds - stage2.rounds"
    )
    lr: float | None = Field(None, gt=0)
    local_epochs: float | None = Field(None, gt=0)
    local_steps: int | None = Field(None, ge=1, le=MAX_COUNT)
    batch_size: int | None = Field(None, ge=1, le=MAX_COUNT)


class EntkSpec(Section):
    """Convexify: eNTK features of the bootstrapped model with its head re-initialized."""

    subsample: int = Field(
        100_000, gt=0, le=10**8, description="p, the number of eNTK coordinates kept"
    )
    seed: int = Field(
        0, ge=0, le=MAX_SEED, description="seed of the head re-initialization and the mask"
    )
    dtype: Literal["fp16", "fp32"] = "fp16"
    chunk: int = Field(
        256, ge=1, le=MAX_COUNT, description="samples per extraction batch and Zarr chunk"
    )


class Stage2Spec(Section):
    """Stage 2: federated least squares on the normalized features (Appendix A)."""

    algorithm: Literal["scaffold", "fedavg", "gd"] = "scaffold"
    rounds: int = Field(100, ge=1, le=MAX_COUNT, description="T2")
    local_steps: int = Field(500, ge=1, le=MAX_COUNT, description="M, full-batch steps per round")
    lr: float = Field(5e-5, gt=0, description="eta")
    solver: Annotated[Literal["closed_form", "explicit"], OMIT_IF_DEFAULT] = Field(
        "closed_form",
        description="closed_form: each round's M local steps exactly, from one factorization "
        "per client; explicit: step by step (the reference, M times slower)",
    )


class TCTConfig(MethodConfig):
    trainer: ClassVar[str | None] = None  # trained by its stages: a FedAvg run, then regress
    name: Literal["tct"] = "tct"
    stage1: Stage1Spec = Stage1Spec()
    entk: EntkSpec = EntkSpec()
    stage2: Stage2Spec = Stage2Spec()

    def check(self, spec) -> None:
        """TCT re-initializes the last linear layer: there must be layers with parameters
        before it. And stage 1 must have rounds."""
        if spec.model.arch == "mlp" and not spec.model.hidden:
            raise InputError(
                "model.hidden: [] makes the model a single linear layer, so TCT has no features "
                "to keep when it re-initializes that layer; give the mlp hidden layers"
            )
        self.stage1_rounds(spec)

    def stage1_rounds(self, spec) -> int:
        """T1: stage1.rounds, else federation.rounds - T2 (the paper's budget of rounds)."""
        if self.stage1.rounds is not None:
            return self.stage1.rounds
        rounds = spec.federation.rounds - self.stage2.rounds
        if rounds < 1:
            raise InputError(
                f"algorithm.stage1.rounds: unset, so T1 = federation.rounds "
                f"({spec.federation.rounds}) - stage2.rounds ({self.stage2.rounds}) = {rounds}; "
                "set stage1.rounds or raise federation.rounds"
            )
        return rounds

    def plan(self, spec: Spec) -> StageNode:
        """bootstrap (FedAvg's train node) -> entk -> regress (fedhet.methods.tct.plan)."""
        stage1 = bootstrap_spec(spec, self)
        bootstrap = train_node(stage1)
        bootstrap.spec = stage1
        return regress_node(entk_node(bootstrap, self.entk), self.stage2)

    def learning_rates(self, spec: Spec) -> list[float]:
        """Stage 1's schedule (FedAvg's), then stage 2's constant eta."""
        stage1 = super().learning_rates(bootstrap_spec(spec, self))
        return stage1 + [self.stage2.lr] * self.stage2.rounds

    def score_artifact(
        self, ctx: RunContext, node: StageNode, artifact: zarr.Group, model: ModelChoice
    ) -> Scores:
        """The stage-2 linear model, scored on the eNTK features of the test set and clients."""
        from fedhet.methods.tct.evaluation import linear_scores

        return linear_scores(artifact, ctx.upstream(node, "entk"), model)

    def base_label(self) -> str:
        variant = self.stage2.algorithm
        return "tct" if variant == "scaffold" else f"tct-{variant}"
