"""Models: shapes, exact split/rejoin, seeded init, norm layers, sizes, reference forwards."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch import nn

from fedhet.core.errors import InputError
from fedhet.core.spec import ModelSpec
from fedhet.models import FedModel, build_model, num_parameters

torch.set_num_threads(1)

ARCHS = ["mlp", "simple_cnn", "resnet18", "resnet20"]
NORMS = ["batch", "group", "none"]
SHAPES = [(1, 8, 8), (1, 28, 28), (3, 32, 32)]
SMALL = {"hidden": [16, 8], "channels": [4, 8], "fc_width": 16, "width": 4}


def small(arch: str, norm: str = "none", **overrides) -> ModelSpec:
    return ModelSpec(arch=arch, norm=norm, **{**SMALL, **overrides})


def inputs(shape: tuple[int, int, int], n: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, *shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("shape", SHAPES)
def test_output_and_feature_shapes(arch, shape):
    model = build_model(small(arch, "batch"), shape, num_classes=7, seed=0)
    x = inputs(shape)
    assert isinstance(model, FedModel) and isinstance(model.head, nn.Linear)
    assert model.features(x).shape == (3, model.feature_dim)
    assert model(x).shape == (3, 7)


def test_feature_dims_follow_the_spec():
    shape = (1, 28, 28)
    assert build_model(small("mlp"), shape, 10, 0).feature_dim == 8
    assert build_model(small("mlp", hidden=[]), shape, 10, 0).feature_dim == 784
    assert build_model(small("simple_cnn"), shape, 10, 0).feature_dim == 16
    assert build_model(small("resnet18"), shape, 10, 0).feature_dim == 4 * 8
    assert build_model(small("resnet20"), shape, 10, 0).feature_dim == 4 * 4


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("norm", ["batch", "group"])
@pytest.mark.parametrize("train", [False, True])
def test_split_then_rejoin_is_exactly_the_model(arch, norm, train):
    shape = (3, 32, 32) if arch == "simple_cnn" else (1, 8, 8)
    model = build_model(small(arch, norm), shape, 5, seed=1).train(train)
    x = inputs(shape)
    expected = model(x)
    all_params = {id(p) for p in model.parameters()}
    for point in model.split_points():
        low, high = model.split(point)
        assert torch.equal(high(low(x)), expected), point
        # the two parts share the model's parameters and together hold each exactly once
        parts = [id(p) for p in low.parameters()] + [id(p) for p in high.parameters()]
        assert sorted(parts) == sorted(all_params), point


@pytest.mark.parametrize(
    "arch, points",
    [
        ("mlp", ["hidden1", "hidden2"]),
        ("simple_cnn", ["conv1", "conv2", "fc1"]),
        ("resnet18", ["stem", "layer1", "layer2", "layer3", "layer4", "pool"]),
        ("resnet20", ["stem", "layer1", "layer2", "layer3", "pool"]),
    ],
)
def test_split_points_in_forward_order_and_last_is_the_feature_extractor(arch, points):
    model = build_model(small(arch), (1, 8, 8), 3, 0)
    assert model.split_points() == points
    x = inputs((1, 8, 8))
    low, high = model.split(points[-1])
    assert torch.equal(low(x), model.features(x))
    assert list(high) == [model.head]


def test_resnet_stages_halve_space_and_double_width():
    model = build_model(small("resnet18"), (3, 32, 32), 10, 0)
    x = inputs((3, 32, 32))
    sizes = {}
    for name, stage in model.features.named_children():
        x = stage(x)
        sizes[name] = tuple(x.shape[1:])
    assert sizes == {  # stride-1 stem, no max-pool: CIFAR-style
        "stem": (4, 32, 32),
        "layer1": (4, 32, 32),
        "layer2": (8, 16, 16),
        "layer3": (16, 8, 8),
        "layer4": (32, 4, 4),
        "pool": (32,),
    }


def test_bad_split_point_names_the_valid_ones():
    model = build_model(small("simple_cnn"), (1, 8, 8), 3, 0)
    with pytest.raises(InputError, match="layer9.*conv1.*conv2.*fc1"):
        model.split("layer9")


@pytest.mark.parametrize("arch", ARCHS)
def test_same_seed_same_weights_different_seed_different(arch):
    spec = small(arch, "batch")
    a, b, c = (build_model(spec, (1, 8, 8), 4, seed) for seed in (3, 3, 4))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    weights = [k for k in sa if k.endswith("weight") and sa[k].dim() > 1]
    assert all(not torch.equal(sa[k], sc[k]) for k in weights)


def test_building_leaves_the_global_rng_untouched():
    before = torch.get_rng_state()
    build_model(small("resnet20", "group"), (3, 32, 32), 10, seed=5)
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("norm", NORMS)
def test_norm_choice_puts_the_right_layers_in(arch, norm):
    model = build_model(small(arch, norm), (1, 8, 8), 3, 0)
    kinds = {type(m) for m in model.modules()}
    norm_kinds = kinds & {nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm}
    expected = {
        "batch": {nn.BatchNorm1d if arch == "mlp" else nn.BatchNorm2d},
        "group": {nn.GroupNorm},
        "none": set(),
    }[norm]
    assert norm_kinds == expected
    if norm == "group":
        assert {m.num_groups for m in model.modules() if isinstance(m, nn.GroupNorm)} == {2}


def test_every_conv_and_hidden_linear_is_followed_by_its_norm():
    counts = {
        "mlp": (2, nn.BatchNorm1d),
        "simple_cnn": (2, nn.BatchNorm2d),
        "resnet20": (1 + 2 * 9 + 2, nn.BatchNorm2d),  # stem, 2 per block, 2 shortcuts
        "resnet18": (1 + 2 * 8 + 3, nn.BatchNorm2d),
    }
    for arch, (count, kind) in counts.items():
        model = build_model(small(arch, "batch"), (1, 8, 8), 3, 0)
        assert sum(isinstance(m, kind) for m in model.modules()) == count, arch


def test_group_norm_needs_groups_dividing_every_width():
    """Refused when the model is validated, before anything is built."""
    with pytest.raises(ValidationError, match="does not divide resnet stage"):
        small("resnet20", "group", groups=3)
    with pytest.raises(ValidationError, match="does not divide model.hidden"):
        small("mlp", "group", groups=3)
    assert small("mlp", "batch", groups=3).groups == 3  # groups matter with GroupNorm only


def test_bad_inputs_raise_input_error():
    with pytest.raises(InputError):
        build_model(small("simple_cnn"), (1, 3, 3), 10, 0)
    with pytest.raises(ValidationError, match="channels must list 2 conv widths"):
        small("simple_cnn", channels=[4, 8, 16])  # refused when the spec is validated
    with pytest.raises(InputError):
        build_model(small("mlp"), (1, 8, 8), 0, 0)


def test_mlp_without_hidden_is_multinomial_logistic_regression():
    model = build_model(small("mlp", hidden=[]), (1, 28, 28), 10, 0)
    assert num_parameters(model) == 784 * 10 + 10
    x = inputs((1, 28, 28))
    reference = x.flatten(1) @ model.head.weight.T + model.head.bias
    torch.testing.assert_close(model(x), reference)


def test_mlp_matches_a_functional_reference():
    """FedTAN's 784-30-10 MLP with BN after the hidden layer, in train mode (batch statistics)."""
    model = build_model(small("mlp", "batch", hidden=[30]), (1, 28, 28), 10, 0).train()
    assert num_parameters(model) == 784 * 30 + 30 + 2 * 30 + 30 * 10 + 10
    linear, bn = model.features.hidden1[1], model.features.hidden1[2]
    x = inputs((1, 28, 28), n=4)
    h = F.linear(x.flatten(1), linear.weight, linear.bias)
    h = (h - h.mean(0)) / torch.sqrt(h.var(0, unbiased=False) + bn.eps) * bn.weight + bn.bias
    reference = F.linear(F.relu(h), model.head.weight, model.head.bias)
    torch.testing.assert_close(model(x), reference)


@pytest.mark.parametrize("shape", SHAPES)
def test_simple_cnn_matches_a_functional_reference(shape):
    model = build_model(small("simple_cnn"), shape, 10, 0)
    conv1, conv2 = model.features.conv1[0], model.features.conv2[0]
    fc1 = model.features.fc1[1]
    x = inputs(shape)
    h = F.max_pool2d(F.relu(F.conv2d(x, conv1.weight, conv1.bias, padding=2)), 2)
    h = F.max_pool2d(F.relu(F.conv2d(h, conv2.weight, conv2.bias, padding=2)), 2)
    h = F.relu(F.linear(h.flatten(1), fc1.weight, fc1.bias))
    reference = F.linear(h, model.head.weight, model.head.bias)
    torch.testing.assert_close(model(x), reference)


def test_simple_cnn_default_size_is_the_fedavg_cnn():
    """channels [32, 64], fc 512 on 28x28: 5x5 'same' convs -> 7x7x64 -> 512 -> 10."""
    model = build_model(ModelSpec(arch="simple_cnn"), (1, 28, 28), 10, 0)
    expected = (25 * 32 + 32) + (25 * 32 * 64 + 64) + (7 * 7 * 64 * 512 + 512) + (512 * 10 + 10)
    assert num_parameters(model) == expected


def test_resnet_sizes_match_the_standard_models():
    resnet20 = build_model(ModelSpec(arch="resnet20", norm="batch", width=16), (3, 32, 32), 10, 0)
    assert 0.26e6 < num_parameters(resnet20) < 0.28e6  # He et al.: 0.27M
    resnet18 = build_model(ModelSpec(arch="resnet18", norm="batch", width=64), (3, 32, 32), 10, 0)
    assert 11.1e6 < num_parameters(resnet18) < 11.2e6  # CIFAR ResNet-18: 11.17M


def test_num_parameters_counts_parameters_not_buffers():
    model = build_model(small("mlp", "batch", hidden=[5]), (1, 2, 2), 3, 0)
    # Linear(4,5) + BN affine 2*5 + head Linear(5,3); running stats are buffers
    assert num_parameters(model) == (4 * 5 + 5) + 10 + (5 * 3 + 3)
