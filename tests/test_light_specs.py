"""What validating a spec knows without building anything: the model's split points."""

from __future__ import annotations

import pytest

from fedhet.core.spec import ModelSpec
from fedhet.models import build_model


@pytest.mark.parametrize(
    "model",
    [
        ModelSpec(arch="mlp", hidden=[]),
        ModelSpec(arch="mlp", hidden=[8, 4, 2]),
        ModelSpec(arch="simple_cnn", channels=[2, 4], fc_width=8),
        ModelSpec(arch="resnet18", width=2),
        ModelSpec(arch="resnet20", width=2),
    ],
    ids=lambda m: f"{m.arch}-{len(m.hidden)}",
)
def test_split_points_known_from_the_spec_are_the_built_models(model: ModelSpec):
    assert model.split_points() == build_model(model, (1, 8, 8), 10, seed=0).split_points()
