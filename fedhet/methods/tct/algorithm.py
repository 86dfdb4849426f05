"""TCT (Train-Convexify-Train) as a fedhet algorithm: its three-stage plan.

    bootstrap (a FedAvg `train`, T1 rounds) -> entk (eNTK features) -> regress (stage 2)

The bootstrap node IS the train node of the equivalent plain FedAvg spec (same upstream,
`algorithm: {name: fedavg}`, federation with stage 1's settings), so a FedAvg run of T1
rounds and every TCT spec sharing stage 1 share one artifact. The algorithm object itself
is never trained: TCT's only federated training is that FedAvg run, and stage 2 lives in
the `regress` stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import ValidationError

from fedhet.core.errors import InputError
from fedhet.core.spec import FederationSpec, Spec, parse_spec
from fedhet.engine.algorithm import Algorithm, ModelChoice
from fedhet.engine.train_plan import train_node
from fedhet.methods.tct.config import TCTConfig
from fedhet.methods.tct.entk_stage import entk_node
from fedhet.methods.tct.regress_stage import regress_node

if TYPE_CHECKING:
    import zarr

    from fedhet.core.pipeline import RunContext, StageNode
    from fedhet.metrics.accuracy import Scores


def stage1_federation(spec: Spec, config: TCTConfig) -> FederationSpec:
    """The spec's federation with stage 1's rounds and overrides."""
    overrides = config.stage1.model_dump(exclude_none=True)
    overrides["rounds"] = config.stage1_rounds(spec)
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


class TCT(Algorithm):
    name = "tct"
    Config = TCTConfig

    @classmethod
    def plan(cls, spec: Spec) -> StageNode:
        config = spec.algorithm
        assert isinstance(config, TCTConfig)
        stage1 = bootstrap_spec(spec, config)
        bootstrap = train_node(stage1)
        bootstrap.spec = stage1
        return regress_node(entk_node(bootstrap, config.entk), config.stage2)

    @classmethod
    def learning_rates(cls, spec: Spec) -> list[float]:
        """Stage 1's schedule (FedAvg's), then stage 2's constant eta."""
        config = spec.algorithm
        assert isinstance(config, TCTConfig)
        stage1 = super().learning_rates(bootstrap_spec(spec, config))
        return stage1 + [config.stage2.lr] * config.stage2.rounds

    @classmethod
    def score_artifact(
        cls, ctx: RunContext, node: StageNode, artifact: zarr.Group, model: ModelChoice
    ) -> Scores:
        """The stage-2 linear model, scored on the eNTK features of the test set and clients."""
        from fedhet.methods.tct.evaluation import linear_scores

        return linear_scores(artifact, ctx.upstream(node, "entk"), model)
