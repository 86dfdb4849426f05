"""`fedhet export`: the long table of every run's per-round metrics, read back in each format and
compared with the runs' Zarr arrays; bad input exits 2 in one line and writes nothing."""

from __future__ import annotations

import json
import math
import os
import pty
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow
import pyarrow.csv
import pyarrow.parquet
import pytest
from conftest import REPO, TINY_SPEC, cli_env, write_spec

from fedhet.core import units
from fedhet.core.spec import load_spec
from fedhet.core.store import ArtifactStore
from fedhet.execution.planning import runs_of

LEARNING_RATES = [0.05, 0.1]
SPEC = {
    **TINY_SPEC,
    "federation": {"rounds": 3, "batch_size": 64, "lr": 0.05, "local_steps": 2},
    "eval": {"every": 2},  # round 1 has no test accuracy: NaN in the arrays and the table
    "runtime": {"threads": 1, "progress": False, "device": "cpu"},
    "matrix": {"federation.lr": LEARNING_RATES},
}


@pytest.fixture(scope="module")
def trained(fedhet, tmp_path_factory) -> tuple[Path, Path]:
    """(spec, store) of a trained two-run matrix."""
    folder = tmp_path_factory.mktemp("export")
    spec, store = write_spec(folder / "matrix.yaml", SPEC), folder / "store"
    assert fedhet("train", spec, "--store", store).rc == 0
    return spec, store


def read_back(path: Path, fmt: str) -> list[dict]:
    if fmt == "json":
        return json.loads(path.read_text())
    reader = pyarrow.csv.read_csv if fmt == "csv" else pyarrow.parquet.read_table
    return reader(path).to_pylist()


def as_float(value) -> float:
    return math.nan if value is None else float(value)


@pytest.mark.parametrize("fmt", ["csv", "parquet", "json"])
def test_the_table_holds_every_runs_zarr_metrics(fedhet, trained, tmp_path, fmt):
    spec, store = trained
    target = tmp_path / f"runs.{fmt}"
    result = fedhet("export", spec, "--format", fmt, "--out", target, "--store", store)
    assert result.rc == 0, result.stderr
    rows = read_back(target, fmt)
    runs = runs_of(load_spec(spec))
    assert len(rows) == len(runs) * 3
    for run, lr in zip(runs, LEARNING_RATES, strict=True):
        mine = [r for r in rows if r["run"] == run.label]
        assert [r["round"] for r in mine] == [1, 2, 3]
        assert {(r["algorithm"], r["seed"], r["federation.lr"]) for r in mine} == {
            ("FedAvg", 3, lr)
        }
        metrics = ArtifactStore(store).open("train", run.node.key)["metrics"]
        for name, array in metrics.arrays():  # accuracies in percent, under `_pct` names
            exported = np.array([as_float(r[units.shown_name(name)]) for r in mine])
            shown = units.shown_value(name, array[:].tolist())
            np.testing.assert_array_equal(exported, shown)  # NaN where NaN, bit for bit
    assert math.isnan(as_float(rows[0]["test_accuracy_pct"]))


def test_standard_output_gets_the_csv_table(fedhet, trained, tmp_path):
    spec, store = trained
    result = fedhet("export", spec, "--store", store)
    assert result.rc == 0
    (tmp_path / "out.csv").write_text(result.stdout)
    assert read_back(tmp_path / "out.csv", "csv") == read_back(
        _export_file(fedhet, spec, store, tmp_path), "csv"
    )


def _export_file(fedhet, spec: Path, store: Path, folder: Path) -> Path:
    target = folder / "file.csv"
    assert fedhet("export", spec, "--out", target, "--store", store).rc == 0
    return target


@pytest.mark.parametrize(
    "args",
    [
        ["--format", "xlsx", "--out", "{tmp}/runs.xlsx"],
        ["--out", "{tmp}/no-such-folder/runs.csv"],
        ["--out", "{tmp}"],  # a folder
        ["--tensorboard", "{tmp}/a-file/events"],
    ],
    ids=["format", "missing-folder", "out-is-a-folder", "tensorboard-under-a-file"],
)
def test_bad_input_exits_2_in_one_line_writing_nothing(fedhet, trained, tmp_path, args):
    spec, store = trained
    (tmp_path / "a-file").write_text("not a folder")
    before = sorted(tmp_path.rglob("*"))
    result = fedhet("export", spec, *[a.format(tmp=tmp_path) for a in args], "--store", store)
    assert result.rc == 2
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: ")
    assert result.stdout == "" and sorted(tmp_path.rglob("*")) == before


def _export_parquet(spec: Path, store: Path, stdout: int) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "fedhet", "export", spec, "--format", "parquet"]
    return subprocess.run(
        [*map(str, command), "--store", str(store)],
        stdout=stdout,
        stderr=subprocess.PIPE,
        env=cli_env(),
        cwd=REPO,
        timeout=180,
    )


def test_parquet_is_refused_on_a_terminal_and_written_to_a_pipe(trained):
    spec, store = trained
    terminal, screen = pty.openpty()
    try:
        refused = _export_parquet(spec, store, screen)
        os.set_blocking(terminal, False)
        try:
            shown = os.read(terminal, 1 << 16)
        except BlockingIOError:
            shown = b""
    finally:
        os.close(terminal)
        os.close(screen)
    stderr = refused.stderr.decode()
    assert refused.returncode == 2 and shown == b""
    assert len(stderr.splitlines()) == 1 and "--out" in stderr and "Traceback" not in stderr
    piped = _export_parquet(spec, store, subprocess.PIPE)
    assert piped.returncode == 0 and piped.stdout[:4] == b"PAR1"
    assert len(pyarrow.parquet.read_table(pyarrow.BufferReader(piped.stdout))) == 2 * 3
