"""Datasets and models as plug-ins, end to end: a third-party package
(tests/plugins/fedhet_example_zoo) adds a dataset with its own clients (`blobs`) and a network
(`twolayer`) through the `fedhet.datasets` and `fedhet.models` entry points; once installed they
validate without torch and train like fedhet's own, with no edit inside fedhet.

The package is installed as tests/test_plugins.py installs its method plug-in: into a temporary
folder that only the `fedhet` commands get on their PYTHONPATH."""

from __future__ import annotations

import logging
import subprocess
import sys
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import pytest
import zarr
from conftest import REPO, CliRunner, write_spec
from test_plugins import env_with, install

from fedhet.core import plugins
from fedhet.core.data_config import DataConfig
from fedhet.core.spec import dataset_configs, model_configs

SPEC = {
    "name": "zoo",
    "seed": 2,
    "data": {"dataset": "blobs", "clients": 4, "per_client": 60, "shift": 1.0},
    "partition": {"scheme": "natural"},
    "model": {"arch": "twolayer", "width": 12},
    "federation": {"rounds": 10, "batch_size": 16, "lr": 0.2},
    "runtime": {"threads": 1, "progress": False, "device": "cpu"},
    "matrix": {"algorithm": [{"name": "fedavg"}, {"name": "scaffold"}]},
}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install(["fedhet_example_zoo"], tmp_path_factory.mktemp("zoo"))


@pytest.mark.slow
def test_a_plugin_dataset_and_model_train_after_install(
    fedhet: CliRunner, zoo: Path, tmp_path: Path
):
    spec, store = write_spec(tmp_path / "zoo.yaml", SPEC), tmp_path / "store"
    env = env_with(store, zoo)
    validated = fedhet("spec", "validate", spec, env=env)
    assert (validated.rc, validated.stderr) == (0, "")

    trained = fedhet("train", spec, env=env)
    assert trained.rc == 0, trained.stderr
    (partition,) = (store / "partition").glob("*.zarr")
    histogram = zarr.open_group(partition, mode="r")["histogram"][:]
    assert histogram.sum(axis=1).tolist() == [48] * 4  # its clients: 60 samples, a fifth tested
    runs = list((store / "train").glob("*.zarr"))
    assert len(runs) == 2
    for run in runs:
        group = zarr.open_group(run, mode="r")
        assert group.attrs["config"]["model"] == {"arch": "twolayer", "norm": "none", "width": 12}
        assert group["metrics"]["test_accuracy"][-1] > 0.7  # 3 blobs: 0.88 at seed 2; chance 1/3


def test_planning_a_plugins_spec_imports_no_torch(zoo: Path, tmp_path: Path):
    spec = write_spec(tmp_path / "zoo.yaml", SPEC)
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "fedhet", "plan", spec, "--store", tmp_path],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env_with(tmp_path, zoo),
    )
    assert proc.returncode == 0, proc.stderr[-1000:]
    assert "3 stages: 3 missing" in proc.stdout  # the plug-ins' partition and 2 trainings
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()]
    assert not [m for m in imported if m == "torch" or m.startswith("torch.")]


def test_without_the_plugin_its_names_are_refused_in_one_line(fedhet: CliRunner, tmp_path: Path):
    spec = write_spec(tmp_path / "zoo.yaml", SPEC)
    result = fedhet("spec", "validate", spec, store=tmp_path)
    assert result.rc == 2
    (line,) = result.stderr.splitlines()
    assert "data.dataset: unknown value; choose one of arrays, cifar10" in line
    assert "(got 'blobs')" in line


def test_a_plugin_model_is_seeded_by_fedhet(zoo: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(zoo))
    from fedhet_example_zoo.plugin import TwoLayerConfig

    from fedhet.models import build_model

    config = TwoLayerConfig(width=5)
    first, again, other = (build_model(config, (1, 1, 8), 3, seed) for seed in (0, 0, 1))
    assert first.split_points() == ["features"] and first.feature_dim == 5
    states = [m.state_dict()["head.weight"].numpy() for m in (first, again, other)]
    assert np.array_equal(states[0], states[1]) and not np.array_equal(states[0], states[2])
    counted = sum(p.numel() for p in first.parameters())
    assert counted == config.parameter_count((1, 1, 8), 3)


class Digits(DataConfig):
    """A plug-in that takes the name of one of fedhet's datasets."""

    loader: ClassVar[str] = "fedhet.data.synthetic:generate"
    dataset: Literal["digits"] = "digits"


def test_a_broken_plugin_is_skipped_in_one_line_and_the_others_keep_working(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    fedhet_own = [e for e in entry_points(group=plugins.DATASETS) if e.name != "synthetic"]
    entries = {
        plugins.DATASETS: [  # fedhet's own last: they load first all the same
            EntryPoint("synthetic", "fedhet.data.synthetic:SyntheticData", plugins.DATASETS),
            EntryPoint("gone", "fedhet_no_such_package:Data", plugins.DATASETS),
            EntryPoint("digits", "test_data_plugins:Digits", plugins.DATASETS),
            EntryPoint("again", "fedhet.data.synthetic:SyntheticData", plugins.DATASETS),
            *fedhet_own,
        ],
        plugins.MODELS: [EntryPoint("mlp", "fedhet.core.spec:ModelSpec", plugins.MODELS)],
    }
    monkeypatch.setattr(plugins, "entry_points", lambda group: entries[group])
    plugins.found.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="fedhet.core.plugins"):
            assert list(dataset_configs()) == sorted([*(e.name for e in fedhet_own), "synthetic"])
            assert "mlp" in model_configs()
    finally:
        plugins.found.cache_clear()
    problems = "\n".join(r.getMessage() for r in caplog.records)  # entry points by name
    assert len(caplog.records) == 4
    assert "(gone = fedhet_no_such_package:Data): cannot be loaded: ModuleNotFoundError" in problems
    assert "(digits = test_data_plugins:Digits): dataset 'digits' is taken" in problems
    assert "(synthetic = fedhet.data.synthetic:SyntheticData): dataset 'synthetic' is" in problems
    assert "ModelSpec'> is not a fedhet.core.model_config.ModelConfig with a builder" in problems
