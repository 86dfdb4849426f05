"""A full disk while a run writes a checkpoint: one line that says the run resumes from its last
checkpoint once space is freed (exit 1), no temporary checkpoint left behind, and the same
command then finishes the run with the result of an uninterrupted one. A full disk while
`report` writes its files: one line naming the file, and no part of a file left behind."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_SPEC, CliRunner, cli_env, run_fedhet, write_spec

from fedhet.core.errors import RunError
from fedhet.core.spec import Spec
from fedhet.core.store import ArtifactStore
from fedhet.engine import run_format
from fedhet.execution.planning import runs_of
from fedhet.execution.results import execute, stored_metrics
from fedhet.figures import FORMATS

RUNTIME = {"threads": 1, "progress": False, "device": "cpu", "checkpoint_every": 1}
RAW = {**TINY_SPEC, "federation": {**TINY_SPEC["federation"], "rounds": 3}, "runtime": RUNTIME}
FULL_AT = 2  # the checkpoint of this round finds the disk full

# Loaded by the fedhet subprocess (PYTHONPATH): its checkpoint of round FULL_AT fails with ENOSPC.
SITECUSTOMIZE = f"""
import errno
from fedhet.engine import run_format

_write = run_format.write_run_state

def _full_at_round(group, state, deltas):
    if state.round == {FULL_AT}:
        group.create_array("partly", shape=(4,), dtype="f4")  # something written, then full
        raise OSError(errno.ENOSPC, "No space left on device")
    _write(group, state, deltas)

run_format.write_run_state = _full_at_round
"""


def leftovers(store: Path) -> list[str]:
    return [p.name for p in store.rglob("*") if ".tmp-" in p.name]


def test_a_full_disk_stops_the_run_in_one_line_and_it_resumes(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FEDHET_STORE", str(tmp_path / "store"))
    (run,) = runs_of(Spec.model_validate(RAW))
    store = ArtifactStore()
    write = run_format.write_run_state

    def full(group, state, deltas):
        if state.round == FULL_AT:
            raise OSError(errno.ENOSPC, "No space left on device")
        write(group, state, deltas)

    monkeypatch.setattr(run_format, "write_run_state", full)
    with pytest.raises(RunError) as stopped:
        execute(run, store)
    message = str(stopped.value)
    assert "no space left" in message and "\n" not in message
    assert f"resumes from round {FULL_AT} of 3, its last checkpoint" in message
    assert leftovers(store.root) == [] and not store.exists("train", run.node.key)
    assert run_format.Checkpoints(store.partial_dir("train", run.node.key)).latest_round() == 1

    monkeypatch.setattr(run_format, "write_run_state", write)  # space freed
    resumed = stored_metrics(execute(run, store))
    monkeypatch.setenv("FEDHET_STORE", str(tmp_path / "reference"))
    reference = stored_metrics(execute(run, ArtifactStore()))
    for name in ("test_accuracy", "train_loss", "divergence"):
        np.testing.assert_array_equal(resumed[name], reference[name])


def test_the_command_line_says_it_in_one_line_and_leaves_no_temporary(
    fedhet: CliRunner, tmp_path: Path
) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    spec = write_spec(tmp_path / "spec.yaml", RAW)
    store = tmp_path / "store"
    env = cli_env(store, PYTHONPATH=f"{hooks}:{Path(__file__).resolve().parents[1]}")
    full = run_fedhet("train", spec, env=env)
    assert full.rc == 1, full.stderr
    (line,) = [line for line in full.stderr.splitlines() if line.startswith("error: ")]
    assert "no space left" in line and f"resumes from round {FULL_AT} of 3" in line
    assert "Traceback" not in full.stderr and "unexpected" not in full.stderr
    assert leftovers(store) == []
    freed = fedhet("train", spec, store=store)  # space freed: no failing hook, a forked main()
    assert freed.rc == 0 and "resuming train" in freed.stderr


# Loaded by the fedhet subprocess (PYTHONPATH): the disk is full for files opened for writing
# under $FULL_FOLDER once $WRITES_LEFT of them were written; a few bytes land before the error.
FULL_FOLDER_SITECUSTOMIZE = """
import builtins, errno, io, os

_open, _left = io.open, int(os.environ["WRITES_LEFT"])

def _full(file, mode="r", *args, **kwargs):
    global _left
    handle = _open(file, mode, *args, **kwargs)
    if "w" not in mode or not os.path.abspath(file).startswith(os.environ["FULL_FOLDER"]):
        return handle
    if _left:
        _left -= 1
        return handle
    with handle:
        handle.write(b"part" if "b" in mode else "part")
    raise OSError(errno.ENOSPC, "No space left on device")

io.open = builtins.open = _full
"""


@pytest.mark.parametrize("writes_left", [0, len(FORMATS)], ids=["figure", "markdown"])
def test_report_on_a_full_disk_names_the_file_in_one_line_and_leaves_none_behind(
    fedhet: CliRunner, tmp_path: Path, writes_left: int
) -> None:
    spec, store = write_spec(tmp_path / "spec.yaml", RAW), tmp_path / "store"
    assert fedhet("train", spec, store=store).rc == 0
    hooks, out = tmp_path / "hooks", tmp_path / "reports"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(FULL_FOLDER_SITECUSTOMIZE)
    env = cli_env(
        store,
        PYTHONPATH=f"{hooks}:{Path(__file__).resolve().parents[1]}",
        FULL_FOLDER=str(out),
        WRITES_LEFT=str(writes_left),
    )
    full = run_fedhet("report", spec, "--out", out, env=env)
    assert full.rc == 1, full.stderr
    assert "Traceback" not in full.stderr and "unexpected" not in full.stderr
    (line,) = [line for line in full.stderr.splitlines() if line.startswith("error: ")]
    written = out / ("tiny-digits.png" if writes_left == 0 else "tiny-digits.md")
    assert line == (
        f"error: cannot write {written} (No space left on device); free some space and run "
        "the same command"
    )
    left = {p.name: p.read_bytes() for p in out.iterdir()}  # files complete or not there
    if writes_left == 0:
        assert left == {}
    else:  # the figure in every format, then the markdown failed
        assert left.keys() == {f"tiny-digits.{fmt}" for fmt in FORMATS}
        png = left["tiny-digits.png"]
        assert png.startswith(b"\x89PNG") and png.endswith(b"IEND\xaeB`\x82")
        assert left["tiny-digits.pdf"].rstrip().endswith(b"%%EOF")
