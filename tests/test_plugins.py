"""Methods as plug-ins, end to end: a third-party package (tests/plugins/fedhet_example) adds an
algorithm with its own spec block and its own stage through the `fedhet.methods` entry point and
goes through `fedhet spec validate`, `train` and `report` like a built-in; broken plug-ins are
reported in one line each while every other method keeps working.

The packages are built and installed with pip into a temporary folder that only the `fedhet`
commands get on their PYTHONPATH (entry points are found on sys.path), so the shared virtual
environment is never changed. The commands run in forks of the `fedhet` fixture, which puts
PYTHONPATH on sys.path as a new interpreter does and has loaded no method yet.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import CliRunner, cli_env, write_spec

PLUGINS = Path(__file__).parent / "plugins"
BROKEN = {
    "fedhet-broken-import": "cannot be loaded: ModuleNotFoundError",
    "fedhet-broken-duplicate": "duplicate method name 'fedavg'",
    "fedhet-broken-config": "is not a MethodConfig",
}

SPEC = {
    "name": "plugin",
    "seed": 3,
    "data": {"dataset": "digits"},
    "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.3},
    "model": {"arch": "mlp", "hidden": [16]},
    "federation": {"rounds": 2, "batch_size": 32, "lr": 0.05},
    "algorithm": {"name": "skewavg"},
    "runtime": {"threads": 1, "progress": False},
    "matrix": {
        "algorithm": [
            {"name": "fedavg"},
            {"name": "skewavg", "temperature": 0},
            {"name": "skewavg", "temperature": 3},
        ]
    },
}


def install(packages: list[str], folder: Path) -> Path:
    """`pip install` tests/plugins/<package> into `folder`/site, built from copies so that the
    source tree gets no build leftovers; offline (the build backend comes from the venv)."""
    sources = [shutil.copytree(PLUGINS / name, folder / "src" / name) for name in packages]
    site = folder / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["--no-index", "--target", str(site), *map(str, sources)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return site


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install(["fedhet_example"], tmp_path_factory.mktemp("example"))


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    packages = [name.replace("-", "_") for name in BROKEN]
    return install(packages, tmp_path_factory.mktemp("broken"))


def env_with(store: Path, *sites: Path) -> dict[str, str]:
    return cli_env(store, PYTHONPATH=os.pathsep.join(map(str, sites)))


def stored_runs(store: Path) -> dict[str, dict[str, np.ndarray]]:
    """Label of each stored train artifact's algorithm -> its metric arrays."""
    runs = {}
    for path in (store / "train").glob("*.zarr"):
        group = zarr.open_group(path, mode="r")
        algorithm = group.attrs["config"]["algorithm"]
        label = "-".join(str(algorithm[k]) for k in sorted(algorithm))
        runs[label] = {name: array[:] for name, array in group["metrics"].arrays()}
    return runs


@pytest.mark.slow
def test_a_third_party_method_validates_trains_and_reports(
    fedhet: CliRunner, example: Path, tmp_path: Path
):
    spec, store = write_spec(tmp_path / "plugin.yaml", SPEC), tmp_path / "store"
    env = env_with(store, example)

    validated = fedhet("spec", "validate", spec, env=env)
    assert (validated.rc, validated.stderr) == (0, "")
    assert "valid (3 runs)" in " ".join(validated.stdout.split())  # rich wraps long paths

    trained = fedhet("train", spec, env=env)
    assert trained.rc == 0, trained.stderr
    # the plug-in's stage has its own key, shared by both temperatures: computed once
    skew_lines = [line for line in trained.stderr.splitlines() if line.startswith("label_skew ")]
    assert ["computing" in line for line in skew_lines] == [True, False]
    skew = zarr.open_group(next((store / "label_skew").glob("*.zarr")), mode="r")["skew"][:]
    assert skew.shape == (4,) and np.all((skew >= 0) & (skew <= 1)) and skew.max() > 0.1

    runs = stored_runs(store)
    assert sorted(runs) == ["fedavg", "skewavg-0.0", "skewavg-3.0"]
    for metric in ("test_loss", "train_loss", "divergence"):  # temperature 0 is FedAvg
        np.testing.assert_allclose(runs["skewavg-0.0"][metric], runs["fedavg"][metric], rtol=1e-9)
    assert not np.allclose(runs["skewavg-3.0"]["test_loss"], runs["fedavg"]["test_loss"])

    reported = fedhet("report", spec, "--train", "--out", tmp_path / "reports", env=env)
    assert reported.rc == 0, reported.stderr
    assert "computing" not in reported.stderr  # everything was reused
    table = (tmp_path / "reports" / "plugin.md").read_text()
    rows = [line.split(" | ")[0] for line in table.split("\n## ")[0].strip().splitlines()[-3:]]
    # the plug-in's display name and settings, in the one style of every label
    assert rows == ["| FedAvg", "| SkewAvg (temperature=0)", "| SkewAvg (temperature=3)"]


@pytest.mark.slow
def test_broken_plugins_are_reported_in_one_line_each_and_the_rest_keep_working(
    fedhet: CliRunner, example: Path, broken: Path, tmp_path: Path
):
    spec = write_spec(tmp_path / "plugin.yaml", SPEC)
    result = fedhet("spec", "validate", spec, env=env_with(tmp_path / "store", example, broken))
    assert result.rc == 0, result.stderr
    assert "valid (3 runs)" in " ".join(result.stdout.split())
    assert result.stderr == "" and len(result.plugin_warnings) == len(BROKEN)
    for package, problem in BROKEN.items():
        (line,) = [line for line in result.plugin_warnings if f"plugin {package!r}" in line]
        assert line.startswith("warning: ") and problem in line
