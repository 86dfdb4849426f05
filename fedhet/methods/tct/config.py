"""TCT's spec block: `algorithm: {name: tct, stage1: ..., entk: ..., stage2: ...}`."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from fedhet.methods.tct.plan import bootstrap_spec, entk_node, regress_node
from fedhet.methods.tct.sections import EntkSpec, Stage1Spec, Stage2Spec
from fedhet.plugin import InputError, MethodConfig, ModelChoice, train_node

if TYPE_CHECKING:
    import zarr

    from fedhet.plugin import RunContext, Scores, Spec, StageNode


class TCTConfig(MethodConfig):
    trainer: ClassVar[str | None] = None  # trained by its stages: a FedAvg run, then regress
    display_name: ClassVar[str | None] = "TCT"
    name: Literal["tct"] = "tct"
    stage1: Stage1Spec = Stage1Spec()
    entk: EntkSpec = EntkSpec()
    stage2: Stage2Spec = Stage2Spec()

    def check(self, spec) -> None:
        """TCT re-initializes the last linear layer: there must be layers with parameters
        before it. And stage 1 must have rounds."""
        super().check(spec)
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
        stage1 = bootstrap_spec(spec, self.stage1, self.stage1_rounds(spec))
        bootstrap = train_node(stage1)
        bootstrap.spec = stage1
        return regress_node(entk_node(bootstrap, self.entk), self.stage2)

    def learning_rates(self, spec: Spec) -> list[float]:
        """Stage 1's schedule (FedAvg's), then stage 2's constant eta."""
        stage1 = super().learning_rates(bootstrap_spec(spec, self.stage1, self.stage1_rounds(spec)))
        return stage1 + [self.stage2.lr] * self.stage2.rounds

    def stage_starts(self, spec: Spec) -> list[int]:
        """Stage 2 starts after stage 1's rounds."""
        return [self.stage1_rounds(spec)]

    def score_artifact(
        self, ctx: RunContext, node: StageNode, artifact: zarr.Group, model: ModelChoice
    ) -> Scores:
        """The stage-2 linear model, scored on the eNTK features of the test set and clients."""
        from fedhet.methods.tct.evaluation import linear_scores

        return linear_scores(artifact, ctx.upstream(node, "entk"), model)

    def settings(self) -> list[str]:
        variant = self.stage2.algorithm
        return [] if variant == "scaffold" else [f"stage 2 by {variant}"]
