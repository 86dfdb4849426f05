"""A divergence is a result in every command, through the installed `fedhet`: export keeps the
rounds before it with a `diverged` column, eval marks the run, runs and plan say `diverged`,
and train reports a recorded divergence once without computing it again (unless
--retry-diverged)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from conftest import TINY_SPEC, CliResult, write_spec

ROUNDS = 3
RUNTIME = {"threads": 1, "progress": False, "device": "cpu"}


@pytest.fixture(scope="module")
def diverged(fedhet, tmp_path_factory):
    """A stored matrix over federation.lr whose second run diverges in round 1."""
    folder = tmp_path_factory.mktemp("diverged")
    spec = write_spec(
        folder / "div.yaml",
        {
            **TINY_SPEC,
            "federation": {**TINY_SPEC["federation"], "rounds": ROUNDS},
            "runtime": RUNTIME,
            "matrix": {"federation.lr": [0.05, 1.0e30]},
        },
    )
    store = folder / "store"
    first = fedhet("train", spec, store=store)
    assert first.rc == 1, first.stderr
    return spec, store, first


def one_line_error(result: CliResult) -> str:
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    return errors[0]


def test_train_reports_the_divergence_once_and_exits_1(diverged):
    _, _, first = diverged
    assert "round 1: client" in one_line_error(first)
    assert "diverged 1/3" in first.stdout


def test_a_recorded_divergence_is_not_computed_again(fedhet, diverged):
    spec, store, _ = diverged
    again = fedhet("train", spec, store=store)
    assert again.rc == 1
    assert one_line_error(again) == one_line_error(diverged[2])
    assert "computing" not in again.stderr and "resuming" not in again.stderr
    (announced,) = [line for line in again.stderr.splitlines() if "when last run" in line]
    assert "diverged in round 1" in announced and "--retry-diverged" in announced


def test_a_sweep_prints_the_error_once(fedhet, diverged):
    spec, store, _ = diverged
    swept = fedhet("train", spec, "--jobs", "2", store=store)
    assert swept.rc == 1
    message = one_line_error(swept).removeprefix("error: ")
    assert swept.stderr.count(message) == 1
    assert "failed: diverged in round 1" in swept.stderr


def test_retry_diverged_computes_the_run_again(fedhet, diverged, tmp_path):
    spec, store, _ = diverged
    retried = fedhet("train", spec, "--retry-diverged", store=store)
    assert retried.rc == 1 and "round 1: client" in one_line_error(retried)
    assert "resuming train" in retried.stderr and "when last run" not in retried.stderr


def test_export_keeps_the_rounds_before_the_divergence(fedhet, diverged):
    spec, store, _ = diverged
    exported = fedhet("export", spec, "--format", "csv", store=store)
    assert exported.rc == 0, exported.stderr
    rows = list(csv.DictReader(io.StringIO(exported.stdout)))
    stable = [r for r in rows if r["setting"] == "lr=0.05"]
    unstable = [r for r in rows if r["setting"] == "lr=1e+30"]
    assert [r["round"] for r in stable] == ["1", "2", "3"]
    assert all(r["diverged"] == "" for r in stable)
    assert all(float(r["test_accuracy_pct"]) > 0 for r in stable)
    # it diverged in round 1: no round before it, and that round measured nothing
    (row,) = unstable
    assert row["round"] == "1" and row["diverged"] == "1" and row["test_accuracy_pct"] == "nan"
    as_json = json.loads(fedhet("export", spec, "--format", "json", store=store).stdout)
    assert [r["diverged"] for r in as_json] == [None] * ROUNDS + [1]


def test_eval_marks_the_diverged_run_and_scores_the_others(fedhet, diverged):
    spec, store, _ = diverged
    as_json = fedhet("eval", spec, "--json", store=store)
    assert as_json.rc == 0, as_json.stderr
    stable, unstable = json.loads(as_json.stdout)
    assert stable["diverged"] is None and 0 < stable["accuracy_pct"] <= 100
    assert unstable["diverged"] == 1 and unstable["accuracy_pct"] is None
    table = fedhet("eval", spec, store=store)
    assert table.rc == 0 and "diverged in round 1" in table.stdout
    assert table.stderr == ""


def test_runs_and_plan_say_diverged(fedhet, diverged):
    spec, store, _ = diverged
    runs = json.loads(fedhet("runs", spec, "--format", "json", store=store).stdout)
    assert [(r["state"], r["rounds"]) for r in runs] == [("stored", 3), ("diverged", "1/3")]
    only = fedhet("runs", spec, "--state", "diverged", "--format", "csv", store=store)
    assert only.rc == 0 and len(only.stdout.splitlines()) == 2
    plan = fedhet("plan", spec, store=store)
    assert plan.rc == 0 and "partial" not in plan.stdout
    assert plan.stdout.rstrip().splitlines()[-1].endswith("1 diverged; nothing left to run")
    planned = json.loads(fedhet("plan", spec, "--format", "json", store=store).stdout)
    assert planned[-1]["state"] == f"diverged (in round 1 of {ROUNDS})"


def test_the_tensorboard_export_of_a_diverged_run(fedhet, diverged, tmp_path: Path):
    spec, store, _ = diverged
    written = fedhet("export", spec, "--tensorboard", tmp_path / "tb", store=store)
    assert written.rc == 0, written.stderr
    assert len([p for p in (tmp_path / "tb").iterdir() if p.is_dir()]) == 2
