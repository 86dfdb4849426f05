"""The Python API: the example of docs/how-to/python.md runs as written (from the root of a
copy of the repository, leaving its committed files alone), and its tables agree with what the
command line stores and exports."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from conftest import TINY_SPEC, flip_a_byte
from test_docs_code import copy_of_the_repository, stray_changes

import fedhet
from fedhet.core.errors import DamagedArtifactError, InputError

REPO = Path(__file__).resolve().parents[1]
OVERRIDES = ("federation.rounds=2", "matrix.algorithm=[{name: fedavg}, {name: fedprox, mu: 0.01}]")


EXAMPLE_PAGE = "docs/how-to/python.md"


def docs_example() -> str:
    text = (REPO / EXAMPLE_PAGE).read_text()
    block = re.search(
        r"<!-- api-example[^>]*-->\n(?:<!--[^>]*-->\n)*```python\n(.*?)```", text, re.S
    )
    assert block, f"{EXAMPLE_PAGE}'s API example is marked <!-- api-example -->"
    return block.group(1)


@pytest.mark.slow
def test_the_docs_example_runs_as_written(tmp_path, monkeypatch, capsys):
    """From the root of a copy of the repository, as the page says: its ./artifacts store and
    report/ folder, and `git status` there shows no committed file changed."""
    folder = copy_of_the_repository(tmp_path / "repository")
    code = docs_example()
    monkeypatch.chdir(folder)
    monkeypatch.delenv("FEDHET_STORE", raising=False)
    exec(compile(code, EXAMPLE_PAGE, "exec"), {"__name__": "__main__"})  # here: torch is loaded
    printed = capsys.readouterr().out
    assert "within noise" in printed or "ahead" in printed or "behind" in printed
    assert (folder / "report" / "quickstart.md").exists() and (folder / "artifacts").is_dir()
    assert stray_changes(folder) == []


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    store = tmp_path_factory.mktemp("api") / "store"
    experiment = fedhet.load("specs/quickstart.yaml", *OVERRIDES, "seed=0", store=store)
    return experiment, experiment.train()


def test_runs_and_metrics_are_dataframes_of_every_run(trained, monkeypatch):
    monkeypatch.chdir(REPO)
    experiment, results = trained
    runs = experiment.runs()
    assert isinstance(runs, pd.DataFrame) and len(runs) == len(results) == 4
    assert set(runs.state) == {"stored"}
    metrics = experiment.metrics()
    assert list(metrics.columns[:3]) == ["run", "algorithm", "setting"]
    assert len(metrics) == 4 * 2  # a row per run and round
    # the best test accuracy of each run, from its rounds, is the one `runs()` reports
    best = metrics.groupby("run").test_accuracy_pct.max()
    for _, row in runs.iterrows():
        assert best[row.label] == row.best_test_pct


def test_compare_pairs_runs_by_seed(trained):
    experiment, _ = trained
    paired = experiment.compare()
    assert set(paired.algorithm) == {"FedProx"}
    assert set(paired.verdict) == {"too few seeds"}  # one seed: no interval
    assert (paired[paired.unit == "points"].pairs == 1).all()  # rounds: target never reached


def test_a_mapping_spec_with_overrides_and_a_missing_run(tmp_path):
    spec = {"name": "tiny", "data": {"dataset": "digits"}, "federation": {"rounds": 1}}
    experiment = fedhet.load(spec, "seed=3", store=tmp_path)
    assert experiment.spec.seed == 3
    assert list(experiment.runs().state) == ["missing"]
    with pytest.raises(InputError, match="runs are not stored"):
        experiment.metrics()


@pytest.mark.parametrize("damage", ["metrics/test_accuracy", "zarr.json"])
def test_a_damaged_artifact_raises_fedhets_error_naming_it(tmp_path, damage):
    experiment = fedhet.load(TINY_SPEC, "runtime.progress=false", store=tmp_path)
    experiment.train()
    (key,) = experiment.runs().key
    run = tmp_path / "train" / f"{key}.zarr"
    if damage == "zarr.json":
        (run / damage).write_text("not json")
    else:
        flip_a_byte(run / damage)
    expected = f"train/{key[:12]}: the stored {damage} is damaged"
    with pytest.raises(DamagedArtifactError, match=re.escape(expected)):
        experiment.metrics()
