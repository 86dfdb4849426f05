"""TCT's plan (no torch): three stages, each keyed by what determines it.

    bootstrap (a FedAvg `train`, T1 rounds) -> entk (eNTK features) -> regress (stage 2)

The bootstrap node IS the train node of the equivalent plain FedAvg spec (same upstream,
`algorithm: {name: fedavg}`, federation with stage 1's settings), so a FedAvg run of T1
rounds and every TCT spec sharing stage 1 share one artifact. TCT has no trainer of its own:
its only federated training is that FedAvg run, and stage 2 lives in the `regress` stage
(fedhet.methods.tct.entk_stage and regress_stage compute the artifacts).
"""

from __future__ import annotations

from pydantic import ValidationError

from fedhet.methods.tct.sections import EntkSpec, Stage1Spec, Stage2Spec
from fedhet.plugin import FederationSpec, InputError, Spec, StageNode, parse_run

ENTK_VERSION = 3  # 2: im2col/batch-last gather; 3: grouped-conv whole gradients (float32 rounding)
REGRESS_VERSION = 3  # 2: closed-form float64 solver; 3: per-round products in float32 (rounding)


def entk_node(bootstrap: StageNode, config: EntkSpec) -> StageNode:
    return StageNode("entk", ENTK_VERSION, config.model_dump(mode="json"), {"bootstrap": bootstrap})


def regress_node(entk: StageNode, config: Stage2Spec) -> StageNode:
    return StageNode("regress", REGRESS_VERSION, config.model_dump(mode="json"), {"entk": entk})


def stage1_federation(spec: Spec, stage1: Stage1Spec, rounds: int) -> FederationSpec:
    """The spec's federation with stage 1's `rounds` (T1) and overrides."""
    overrides = stage1.model_dump(exclude_none=True)
    overrides["rounds"] = rounds
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


def bootstrap_spec(spec: Spec, stage1: Stage1Spec, rounds: int) -> Spec:
    """The plain FedAvg spec whose train stage is TCT's stage 1 (`rounds` rounds)."""
    data = spec.model_dump(mode="json", exclude={"matrix"})
    data["algorithm"] = {"name": "fedavg", "local_momentum": spec.algorithm.local_momentum}
    data["federation"] = stage1_federation(spec, stage1, rounds).model_dump(mode="json")
    return parse_run(data, "tct stage 1")
