"""Every dataset, fedhet's own and a plug-in's, is one config class of one registry (the
`fedhet.datasets` entry points): it answers its shape, classes and size without loading, and
loads data of exactly that description. A spec naming no registered dataset is refused in one
line listing them all."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pytest
import test_arrays
import test_huggingface
import test_image_folder
import test_leaf
from conftest import CliRunner, write_spec
from pydantic import Field

from fedhet.core import plugins
from fedhet.core.data_config import ArrayData, DataConfig, DataInfo
from fedhet.core.errors import InputError
from fedhet.core.spec import dataset_configs, json_schema, parse_spec
from fedhet.data import datasets
from fedhet.data.datasets import load_data
from fedhet.data.shapes import data_shape
from fedhet.data.sizes import train_samples

IMAGE_DATASETS = ("cifar10", "cifar100", "digits", "emnist", "fmnist", "mnist", "svhn")


class RingData(DataConfig):
    """A plug-in test dataset: points on three rings, one class per ring."""

    loader: ClassVar[str] = "test_data_registry:load_ring"

    dataset: Literal["ring"] = "ring"
    points: int = Field(90, ge=3)

    def describe(self) -> DataInfo:
        return DataInfo((1, 1, 2), 3, self.points)


def load_ring(config: RingData, seed: int) -> ArrayData:
    rng = np.random.default_rng(seed)
    labels = np.arange(config.points) % 3
    angles = rng.uniform(0, 2 * np.pi, config.points)
    x = (labels + 1)[:, None] * np.stack([np.cos(angles), np.sin(angles)], axis=1)
    return ArrayData(x, labels, x[:9], labels[:9])


@pytest.fixture
def with_ring(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """fedhet's registered datasets and the `ring` plug-in, as if a package installed it."""
    ring = EntryPoint("ring", "test_data_registry:RingData", plugins.DATASETS)

    def entries(group: str) -> list[EntryPoint]:
        return [*entry_points(group=group), *([ring] if group == plugins.DATASETS else [])]

    monkeypatch.setattr(plugins, "entry_points", entries)
    plugins.found.cache_clear()
    yield
    plugins.found.cache_clear()


# dataset -> a `data:` block of it (the test's folder given), with the partition it needs
EXAMPLES: dict[str, Callable[[Path], dict[str, Any]]] = {
    **{name: (lambda _, name=name: {"data": {"dataset": name}}) for name in IMAGE_DATASETS},
    "synthetic": lambda _: {"data": {"dataset": "synthetic", "clients": 4}},
    "arrays": lambda tmp: test_arrays.spec_of(test_arrays.digits_npz(tmp / "mine.npz")),
    "images": lambda tmp: test_image_folder.spec_of(test_image_folder.image_folder(tmp / "img")),
    "leaf": lambda tmp: test_leaf.spec_of(test_leaf.leaf_folder(tmp / "leaf", "femnist")),
    "huggingface": lambda tmp: test_huggingface.spec_of(test_huggingface.saved(tmp / "hf")),
    "ring": lambda _: {"data": {"dataset": "ring", "points": 30}},
}


def test_every_registered_dataset_has_an_example_here(with_ring: None):
    assert sorted(dataset_configs()) == sorted(EXAMPLES)
    assert datasets.dataset_names() == sorted(IMAGE_DATASETS)  # those that load by name alone


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_a_dataset_loads_as_its_config_describes_it(name: str, with_ring: None, tmp_path: Path):
    spec = parse_spec(EXAMPLES[name](tmp_path))
    info = spec.data.describe()
    assert type(spec.data) is dataset_configs()[name] and spec.data.dataset == name
    assert data_shape(spec.data) == (info.shape, info.classes)
    assert train_samples(spec.data) == info.train_samples
    try:
        loaded = load_data(spec.data, seed=0)
    except InputError as missing:  # a torchvision dataset not on this machine
        assert spec.data.by_name and "not found" in str(missing)
        pytest.skip(f"{name} is not on this machine")
    assert (loaded.shape, loaded.num_classes) == (info.shape, info.classes)
    assert info.train_samples in (None, len(loaded.train_y))
    if info.clients is not None:
        assert int(loaded.train_client.max()) + 1 == info.clients
    datasets._load_cached.cache_clear()  # a full-size dataset: free its memory


def test_the_image_options_change_what_an_image_dataset_describes():
    data = parse_spec({"data": {"dataset": "mnist", "channels": 3, "resize": 32}}).data
    assert data.describe().shape == (3, 32, 32)
    assert data.identity() is None  # the name says which data: nothing more enters a key


def test_the_schema_enumerates_every_dataset_and_defaults_to_digits(with_ring: None):
    schema = json_schema()
    assert schema["properties"]["data"]["default"]["dataset"] == "digits"
    items = schema["properties"]["matrix"]["anyOf"][0]["properties"]["data.dataset"]["items"]
    assert items["enum"] == sorted(EXAMPLES)


def test_an_unknown_dataset_exits_2_naming_every_registered_one(fedhet: CliRunner, tmp_path):
    spec = write_spec(tmp_path / "s.yaml", {"data": {"dataset": "imagenet"}})
    result = fedhet("spec", "validate", spec, store=tmp_path)
    assert result.rc == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    registered = list(dataset_configs())  # the command's registry is this process's
    assert set(IMAGE_DATASETS) | {"arrays", "images", "leaf", "synthetic"} <= set(registered)
    choices = ", ".join(registered)
    assert f"data.dataset: unknown value; choose one of {choices} (got 'imagenet')" in line


def test_an_install_without_fedhets_own_datasets_is_told_to_reinstall(
    monkeypatch: pytest.MonkeyPatch,
):
    """Metadata older than the code (an editable install not reinstalled) lacks the entries."""
    stale = [e for e in entry_points(group=plugins.DATASETS) if e.name not in IMAGE_DATASETS]
    monkeypatch.setattr(plugins, "entry_points", lambda group: stale)
    plugins.found.cache_clear()
    try:
        with pytest.raises(InputError, match=r"reinstall fedhet \(make install"):
            dataset_configs()
    finally:
        plugins.found.cache_clear()


def test_a_proxy_dataset_names_one_that_loads_by_name():
    pseudo = {"kind": "mixture", "proxy": "synthetic"}
    with pytest.raises(InputError) as refused:
        parse_spec({"algorithm": {"name": "fedbr", "pseudo": pseudo}})
    choices = ", ".join(IMAGE_DATASETS)
    assert f"algorithm.pseudo.proxy: unknown dataset; choose one of {choices}" in str(refused.value)


def test_loading_by_name_in_a_format_the_dataset_cannot_take_is_an_input_error():
    with pytest.raises(InputError, match=r"^data.channels: cifar10 has 3 channels, not 2;"):
        datasets.load_dataset("cifar10", channels=2)  # FedBR's proxy in a grey spec's format
