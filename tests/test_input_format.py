"""The spec's input format (data.channels, data.resize, data.scale): the loaded tensors, the
shape every stage plans with, the keys of specs that leave it at its defaults, and the
one-line refusals of bad values."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_SPEC, CliRunner, write_spec

from fedhet.core.errors import InputError
from fedhet.core.spec import parse_spec
from fedhet.data.datasets import load_data, load_dataset
from fedhet.data.shapes import data_shape
from fedhet.execution.planning import runs_of

DEFAULT = load_dataset("digits")


def digits(**data) -> torch.Tensor:
    return load_data(parse_spec({"data": {"dataset": "digits", **data}}).data)


def test_unit_scale_keeps_the_pixels_in_0_1_without_standardization():
    unit = digits(scale="unit")
    for x in unit.train_x, unit.test_x:
        assert x.min() == 0 and x.max() == 1
    assert unit.mean == (0.0,) and unit.std == (1.0,)
    # the same images as the standardized default, before its affine map
    mean, std = DEFAULT.mean[0], DEFAULT.std[0]
    torch.testing.assert_close((unit.train_x - mean) / std, DEFAULT.train_x)
    torch.testing.assert_close((unit.test_x - mean) / std, DEFAULT.test_x)


def test_channels_repeat_the_grey_image():
    three = digits(channels=3)
    assert three.shape == (3, 8, 8) and three.mean == DEFAULT.mean * 3
    for x, grey in (three.train_x, DEFAULT.train_x), (three.test_x, DEFAULT.test_x):
        for channel in range(3):
            assert torch.equal(x[:, channel : channel + 1], grey)


def test_resize_scales_train_and_test_and_standardizes_the_resized_images():
    resized = digits(resize=16)
    assert resized.train_x.shape[1:] == resized.test_x.shape[1:] == (1, 16, 16)
    assert abs(float(resized.train_x.mean())) < 1e-5
    assert abs(float(resized.train_x.std(correction=0)) - 1) < 1e-4
    assert torch.equal(resized.train_y, DEFAULT.train_y)


def test_the_planned_input_shape_is_the_loaded_one():
    spec = parse_spec({"data": {"dataset": "digits", "channels": 3, "resize": 12, "scale": "unit"}})
    loaded = load_data(spec.data)
    assert data_shape(spec.data) == ((3, 12, 12), 10) == (loaded.shape, loaded.num_classes)
    assert loaded.train_x.min() >= 0 and loaded.train_x.max() <= 1
    assert data_shape(parse_spec({"data": {"dataset": "cifar10"}}).data) == ((3, 32, 32), 10)


def test_default_format_written_out_keeps_the_keys_and_a_format_changes_them():
    plain = parse_spec({"data": {"dataset": "digits"}})
    explicit = parse_spec({"data": {"dataset": "digits", "scale": "standardize"}})
    unit = parse_spec({"data": {"dataset": "digits", "scale": "unit"}})

    def train_key(spec):
        return runs_of(spec)[0].node.key

    assert train_key(plain) == train_key(explicit) != train_key(unit)


def test_a_colour_dataset_cannot_change_its_channel_count():  # refused as the spec is read
    with pytest.raises(InputError, match=r"^spec: data.channels: cifar10 has 3 channels, not 1;"):
        parse_spec({"data": {"dataset": "cifar10", "channels": 1}})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.scale=zero_one"], "data.scale: input should be 'standardize' or 'unit'"),
        (["data.resize=2"], "data.resize: input should be greater than or equal to 4"),
        (["data.dataset=cifar10", "data.channels=1"], "data.channels: cifar10 has 3 channels"),
    ],
)
def test_bad_format_values_are_refused_in_one_line(fedhet: CliRunner, tmp_path, overrides, message):
    spec = write_spec(tmp_path / "format.yaml", TINY_SPEC)
    result = fedhet("spec", "validate", spec, *overrides)
    assert result.rc == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip("\n").splitlines()
    assert message in line
