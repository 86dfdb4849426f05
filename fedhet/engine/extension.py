"""Extending a stored run to more rounds.

A train node whose config equals a stored run's except for `federation.rounds` (R stored, more
wanted) repeats that run's R rounds, when nothing in a round depends on the run's total
(`MethodConfig.extendable`): it then continues from the state the stored run keeps for this
(`continuation/` in its train artifact, see fedhet.engine.run_format), and its result equals a
run from scratch bit for bit.

That state is the one a longer run has after round R, which is not quite the stored run's final
state: a run's last round is always evaluated, a longer run's round R only when R is a multiple
of `eval.every`. The continuation leaves that extra evaluation out (round R's test metrics NaN,
the best model as of the regular evaluations). Runs stored before continuations existed have
none and are not extended. Planning only: no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from fedhet.core.pipeline import StageNode
from fedhet.core.spec import Spec
from fedhet.core.store import ArtifactStore
from fedhet.engine.run_format import (
    CONTINUATION,
    EVALUATION_METRICS,
    VALIDATION_METRICS,
    RunState,
)


@dataclass(frozen=True)
class Extension:
    """The stored run a train node continues: its key and its rounds."""

    key: str
    rounds: int

    def describe(self) -> str:
        return f"extends {self.key[:10]} from round {self.rounds}"


def continuation(final: RunState, before_last: RunState, eval_every: int) -> RunState:
    """The state a longer run has after `final.round` rounds: `final` less the evaluation that
    only the last round gets (`before_last` is the state before that round)."""
    if final.round % eval_every == 0:
        return final
    metrics = {name: list(values) for name, values in final.metrics.items()}
    for name in (*EVALUATION_METRICS, *VALIDATION_METRICS):
        if name in metrics:  # validation metrics exist with a split only
            metrics[name][-1] = math.nan
    return replace(
        final,
        metrics=metrics,
        best_state=before_last.best_state,
        best_accuracy=before_last.best_accuracy,
    )


def with_rounds(node: StageNode, rounds: int) -> StageNode:
    """The train node `node` with `rounds` rounds, all else equal."""
    federation = {**node.config["federation"], "rounds": rounds}
    return replace(node, config={**node.config, "federation": federation})


def stored_prefix(node: StageNode, spec: Spec, store: ArtifactStore) -> Extension | None:
    """The longest stored run, with a continuation, that `node` (a train node of `spec`, not
    stored) extends; None when there is none or `spec`'s rounds depend on the total."""
    federation = node.config.get("federation")
    if node.stage != "train" or not isinstance(federation, dict):
        return None
    for rounds in range(federation["rounds"] - 1, 0, -1):
        key = with_rounds(node, rounds).key
        if (
            store.exists(node.stage, key)
            and CONTINUATION in store.open(node.stage, key)
            and spec.algorithm.extendable(spec, rounds)
        ):
            return Extension(key, rounds)
    return None
