"""The torch-free architecture description is the built model: the same parameters, stage by
stage, the same split points, whatever the input shape; and its shrink hint reaches the memory
check's message."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import get_args

import pytest
import torch

from fedhet.core import architectures
from fedhet.core.errors import InputError
from fedhet.core.memory_check import require_models_fit
from fedhet.core.spec import ModelSpec, expand, load_spec, parse_spec
from fedhet.data.shapes import data_shape
from fedhet.data.torchvision_sets import Cifar10Data
from fedhet.models import build_model, num_parameters
from fedhet.process import memory

torch.set_num_threads(1)

SPECS = sorted((Path(__file__).parents[1] / "specs").glob("*.yaml"))
MODELS = [
    {"arch": "mlp", "hidden": []},
    {"arch": "mlp", "hidden": [30]},
    {"arch": "mlp", "hidden": [12, 8, 4]},
    {"arch": "simple_cnn", "channels": [4, 6], "fc_width": 10},
    {"arch": "simple_cnn"},  # [32, 64], 512: the FedAvg CNN
    {"arch": "fedbr_cnn", "width": 2},
    {"arch": "resnet18", "width": 4},
    {"arch": "resnet20", "width": 2},
    {"arch": "resnet20", "width": 16},
]
NORMS = ["batch", "group", "none"]
SHAPES = [(1, 8, 8), (1, 28, 28), (3, 32, 32), (2, 9, 6)]
CLASSES = [1, 10, 47]


def _stage_parameters(stage: architectures.Stage) -> int:
    return sum(layer.parameters for layer in stage.layers)


def assert_description_is_the_built_model(
    model: ModelSpec, shape: tuple[int, int, int], classes: int
) -> None:
    described = architectures.describe(model, shape, classes)
    built = build_model(model, shape, classes, seed=0)
    assert described.parameter_count == num_parameters(built)
    assert model.parameter_count(shape, classes) == num_parameters(built)
    # each split point is the built stage of that name, at that place, with those parameters
    stages = list(built.features.named_children())
    assert [name for name, _ in stages] == described.split_points == built.split_points()
    for (name, stage), expected in zip(stages, described.stages, strict=True):
        assert num_parameters(stage) == _stage_parameters(expected), name
    assert (built.head.in_features, built.head.out_features) == (
        described.head.n_in,
        described.head.n_out,
    )


@pytest.mark.parametrize(
    ("fields", "norm", "shape", "classes"),
    list(itertools.product(MODELS, NORMS, SHAPES, CLASSES)),
)
def test_description_counts_and_splits_as_the_built_model(fields, norm, shape, classes):
    model = ModelSpec(**fields, norm=norm)
    assert_description_is_the_built_model(model, shape, classes)
    # the split points the spec knows without any input shape are these
    assert model.split_points() == architectures.describe(model, shape, classes).split_points


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_every_committed_specs_model_is_described_exactly(path):
    for _, run in expand(load_spec(path)):
        shape = data_shape(run.data)  # a plug-in dataset's too (synthetic)
        assert_description_is_the_built_model(run.model, shape.image, shape.classes)


def test_fedbr_cnn_is_the_official_rotated_mnist_cnn():
    """FedBR's code (DomainBed's MNIST_CNN): 3x3 convs 1-64-128-128-128, the second with stride
    2, each followed by ReLU then GroupNorm(8); average pooled into 128 features, linear head."""
    model = ModelSpec(arch="fedbr_cnn", width=64, norm="group", groups=8)
    built = build_model(model, (1, 28, 28), 10, seed=0)
    layers = [m for stage in built.features for m in stage]
    convs = [m for m in layers if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride, c.padding) for c in convs] == [
        (1, 64, (3, 3), (1, 1), (1, 1)),
        (64, 128, (3, 3), (2, 2), (1, 1)),
        (128, 128, (3, 3), (1, 1), (1, 1)),
        (128, 128, (3, 3), (1, 1), (1, 1)),
    ]
    kinds = [type(m).__name__ for m in layers]
    assert kinds == ["Conv2d", "ReLU", "GroupNorm"] * 4 + ["AdaptiveAvgPool2d", "Flatten"]
    norms = [m for m in layers if isinstance(m, torch.nn.GroupNorm)]
    assert [(n.num_groups, n.num_channels) for n in norms] == [
        (8, 64),
        (8, 128),
        (8, 128),
        (8, 128),
    ]
    x = torch.randn(3, 1, 28, 28)
    assert built.features(x).shape == (3, 128)
    assert built(x).shape == (3, 10)
    # the official featurizer's parameters (640 + 73,856 + 2 x 147,584 + 896) and Linear(128, 10)
    assert num_parameters(built) == 371_850


def test_every_spec_architecture_is_described():
    assert set(get_args(ModelSpec.model_fields["arch"].annotation)) == set(
        architectures.ARCHITECTURES
    )


@pytest.mark.parametrize(
    ("fields", "hint"),
    [
        ({"arch": "mlp"}, "narrow model.hidden"),
        ({"arch": "simple_cnn"}, "narrow model.channels or model.fc_width"),
        ({"arch": "fedbr_cnn"}, "lower model.width"),
        ({"arch": "resnet18"}, "lower model.width"),
        ({"arch": "resnet20"}, "lower model.width"),
    ],
)
def test_a_model_past_the_memory_names_its_size_and_how_to_shrink_it(monkeypatch, fields, hint):
    monkeypatch.setattr(memory, "available_bytes", lambda: 1024)
    spec = parse_spec({"model": fields, "data": {"dataset": "cifar10"}})
    count = spec.model.parameter_count(*data_shape(Cifar10Data()))
    with pytest.raises(InputError) as refused:
        require_models_fit(spec, Path("big.yaml"), data_shape)
    message = str(refused.value)
    assert message.startswith(f"big.yaml: model ({fields['arch']}): {count:,} parameters need")
    assert message.endswith(f"; {hint}")


def test_a_model_that_fits_is_let_through(monkeypatch):
    spec = parse_spec({"model": {"arch": "resnet20"}, "data": {"dataset": "cifar10"}})
    count = spec.model.parameter_count(*data_shape(Cifar10Data()))
    need = count * memory.FP32_BYTES * memory.COPIES
    monkeypatch.setattr(memory, "available_bytes", lambda: need)
    require_models_fit(spec, Path("fits.yaml"), data_shape)
