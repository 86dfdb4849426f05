"""A diverged stage is a result that outlives the stage (a sweep's list of failures, a worker's
last exception): its error must not keep the stage's tensors alive."""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

import pytest
import torch

from fedhet.core import divergence
from fedhet.core.errors import DivergedError
from fedhet.core.pipeline import RunContext, StageNode, ensure, stage
from fedhet.core.store import ArtifactStore

_alive: list[weakref.ref] = []


def _solver(features: torch.Tensor) -> None:
    raise DivergedError("solver diverged at round 1", 1, {})


@stage("diverging_test_stage")
def _diverging(node, ctx, out, partial) -> None:
    features = torch.zeros(1000)  # stands for a stage's GBs of features
    _alive.append(weakref.ref(features))
    if node.config["chained"]:  # as TCT's stage 2: the solver's error, re-raised by the stage
        try:
            _solver(features)
        except DivergedError:
            del features  # only the solver's frame, inside the first error, still holds them
            raise DivergedError("diverged at round 3", 3, {"train_loss": [1.0, 0.5]}) from None
    raise DivergedError("diverged at round 3", 3, {"train_loss": [1.0, 0.5]})


@pytest.mark.parametrize("chained", [False, True])
def test_a_diverged_stage_is_recorded_and_its_tensors_are_freed(tmp_path, chained: bool) -> None:
    spec = SimpleNamespace(
        name="diverging",
        runtime=SimpleNamespace(threads=None),
        model_dump=lambda **_: {"name": "diverging"},
    )
    store = ArtifactStore(tmp_path)
    node = StageNode("diverging_test_stage", 1, {"chained": chained})
    with pytest.raises(DivergedError) as caught:
        ensure(node, RunContext(spec, store))
    gc.collect()
    assert caught.value.__traceback__ is not None  # the error, traceback and all, still held
    assert _alive and _alive[-1]() is None  # but not the stage's tensors
    recorded = divergence.recorded(store.partial_dir(node.stage, node.key))
    assert recorded is not None and recorded.round_number == 3
    assert recorded.metrics == {"train_loss": [1.0, 0.5]}
