"""A run built on a stage that diverged (TCT whose stage 1 diverges: its eNTK and stage 2 never
run) has that divergence as its result, as a one-stage run has its own: `tune` scores the trial
nothing and goes on (it crashed with a KeyError), `runs` lists the run as diverged, `plan`
its later stages as blocked (nothing left to run), and `report` reads it without asking for
training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import CliRunner, write_spec

from fedhet.core.divergence import record
from fedhet.core.errors import DivergedError
from fedhet.core.spec import load_spec
from fedhet.core.store import ArtifactStore
from fedhet.engine.run_format import METRICS
from fedhet.execution.planning import runs_of

DIVERGING_LR = 1e20  # the MLP's loss is NaN at stage 1's first step
SPEC = {
    "name": "upstream-divergence",
    "data": {"dataset": "digits", "validation": 0.2},
    "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.5},
    "model": {"arch": "mlp", "hidden": [8]},
    "federation": {"rounds": 3, "batch_size": 32, "lr": 0.05, "local_steps": 2},
    "runtime": {"threads": 1, "progress": False, "device": "cpu"},
    "matrix": {
        "algorithm": [
            {
                "name": "tct",
                "stage1": {"rounds": 2},
                "entk": {"subsample": 50, "dtype": "fp32"},
                "stage2": {"rounds": 1, "local_steps": 2, "lr": 1e-3},
            }
        ],
        "seed": [0],
    },
    "tune": {
        "trials": 2,
        "seeds": [7],
        "space": {"federation.lr": {"grid": [0.05, DIVERGING_LR]}},
    },
}


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> Path:
    return write_spec(tmp_path_factory.mktemp("upstream") / "spec.yaml", SPEC)


def test_a_tune_scores_a_trial_whose_first_stage_diverged_nothing(
    fedhet: CliRunner, spec: Path, tmp_path: Path
):
    tuned = fedhet("tune", spec, "--trials", "--format", "json", store=tmp_path)
    assert tuned.rc == 0, tuned.stderr
    assert "Traceback" not in tuned.stderr and "unexpected" not in tuned.stderr
    trials = {row["values"]: row for row in json.loads(tuned.stdout)}
    assert set(trials) == {"lr=0.05", "lr=1e+20"}
    assert trials["lr=1e+20"]["val_score_pct"] is None and trials["lr=1e+20"]["chosen"] == ""
    assert trials["lr=0.05"]["val_score_pct"] > 0 and trials["lr=0.05"]["chosen"] == "yes"


def test_runs_and_report_read_the_first_stages_divergence(
    fedhet: CliRunner, spec: Path, tmp_path: Path
):
    override = f"federation.lr={DIVERGING_LR}"
    trained = fedhet("train", spec, override, store=tmp_path)
    assert trained.rc == 1 and "loss became nan" in trained.stderr
    (row,) = json.loads(fedhet("runs", spec, override, "--format", "json", store=tmp_path).stdout)
    assert row["state"] == "diverged" and row["rounds"] == "1/3"  # of TCT's 2 + 1 rounds
    assert row["final_pct"] is None
    plan = fedhet("plan", spec, override, "--format", "json", store=tmp_path)
    states = {stage["stage"]: stage["state"] for stage in json.loads(plan.stdout)}
    assert states["train"] == "diverged (in round 1 of 2)"
    assert states["entk"] == states["regress"] == "blocked (a stage it is built on diverged)"
    assert "2 blocked; nothing left to run" in fedhet("plan", spec, override, store=tmp_path).stdout
    reported = fedhet("report", spec, override, "--out", tmp_path / "report", store=tmp_path)
    assert reported.rc == 0, reported.stderr
    text = (tmp_path / "report" / "upstream-divergence.md").read_text()
    assert "| TCT | - (n=1) † 1/1 |" in text


def test_a_diverged_first_stages_accuracy_is_not_the_runs(
    fedhet: CliRunner, spec: Path, tmp_path: Path
):
    """Stage 1's model is not TCT's: of its rounds before the divergence only the costs count
    (as in a stored TCT run), not stage 1's 90% test accuracy."""
    override = f"federation.lr={DIVERGING_LR}"
    assert fedhet("train", spec, override, store=tmp_path).rc == 1
    (run,) = runs_of(load_spec(spec, [override]))
    stage1 = next(node for node in run.node.walk() if node.stage == "train")
    before = {name: [1.0] for name in METRICS} | {"test_accuracy": [0.9], "wall_time": [1.5]}
    record(
        ArtifactStore(tmp_path).partial_dir("train", stage1.key), DivergedError("nan", 2, before)
    )
    (row,) = json.loads(fedhet("runs", spec, override, "--format", "json", store=tmp_path).stdout)
    assert row["rounds"] == "2/3" and row["best_test_pct"] is None
    assert row["wall_time_s"] == pytest.approx(1.5)
    exported = fedhet("export", spec, override, "--format", "json", store=tmp_path)
    first = json.loads(exported.stdout)[0]  # round 1, before the divergence in round 2
    assert first["test_accuracy_pct"] is None and first["test_loss"] is None
    assert first["bytes_up"] == 1.0 and first["wall_time_s"] == 1.5
