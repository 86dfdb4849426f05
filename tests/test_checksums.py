"""Verified reads (issue 24): every stored array carries zarr's crc32c checksum, so a flipped
byte fails the read instead of printing a wrong number; a damaged checkpoint is skipped."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import TINY_SPEC, flip_a_byte, write_spec
from rich.console import Console
from zarr.codecs import Crc32cCodec

import fedhet
from fedhet import load
from fedhet.core.pipeline import RunContext, ensure
from fedhet.core.sealed import arrays
from fedhet.core.spec import load_spec
from fedhet.core.store import ArtifactStore
from fedhet.engine.run_format import read_metrics
from fedhet.execution.planning import runs_of
from fedhet.process.interrupts import Interrupted

ROUNDS = 6
SPEC = {
    **TINY_SPEC,
    "partition": {"scheme": "dirichlet", "clients": 6, "alpha": 0.5},
    "federation": {"rounds": ROUNDS, "clients_per_round": 3, "batch_size": 32, "lr": 0.05},
    "algorithm": {"name": "scaffold"},  # clients' states: checkpoints with deltas
    "runtime": {"threads": 1, "progress": False, "device": "cpu", "checkpoint_every": 1},
}


@pytest.fixture(scope="module")
def trained(fedhet, tmp_path_factory) -> tuple[Path, Path, str]:
    """(spec, store, train key) of a stored run."""
    root = tmp_path_factory.mktemp("checksums")
    spec, store = write_spec(root / "run.yaml", SPEC), root / "store"
    assert fedhet("train", spec, store=store).rc == 0
    (run,) = runs_of(load_spec(spec))
    return spec, store, run.node.key


def test_every_stored_array_carries_the_checksum(trained):
    _, store, key = trained
    stored = ArtifactStore(store)
    for info in stored.ls():
        found = dict(arrays(stored.open(info.stage, info.key)))
        assert found, info.stage
        for name, array in found.items():
            assert isinstance(array.metadata.codecs[-1], Crc32cCodec), f"{info.stage}/{name}"
    assert any(name.startswith("continuation/") for name, _ in arrays(stored.open("train", key)))


def test_arrays_written_without_the_checksum_read_as_before(tmp_path):
    group = zarr.open_group(tmp_path / "old.zarr", mode="w")
    metrics = group.create_group("metrics")
    metrics.create_array("test_accuracy", data=np.array([0.5, 0.25]))
    assert read_metrics(group) == {"test_accuracy": [0.5, 0.25]}


def damaged_store(trained, tmp_path, array: str) -> Path:
    """A copy of the trained store with a byte flipped in the run's `array`."""
    _, store, key = trained
    damaged = tmp_path / "store"
    shutil.copytree(store, damaged)
    flip_a_byte(damaged / "train" / f"{key}.zarr" / array)
    return damaged


@pytest.mark.parametrize(
    ("command", "array"),
    [
        (["export"], "metrics/test_accuracy"),
        (["report", "--out", "reports"], "metrics/test_accuracy"),
        (["eval"], "model/final/head.weight"),  # what eval reads
    ],
)
def test_a_damaged_chunk_fails_the_command_in_one_line(fedhet, trained, tmp_path, command, array):
    spec, _, key = trained
    damaged = damaged_store(trained, tmp_path, array)
    result = fedhet(command[0], spec, *command[1:], store=damaged)
    assert result.rc == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == (
        f"error: train/{key[:12]}: the stored {array} is damaged (checksum mismatch); see "
        f"`fedhet artifacts verify`, then `fedhet artifacts rm {key[:12]}` and recompute it"
    )
    assert not any(line.startswith("error") for line in lines[:-1])


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_metadata_file_fails_the_command_as_a_damaged_chunk_does(
    fedhet, trained, tmp_path, damage
):
    spec, store, key = trained
    damaged = tmp_path / "store"
    shutil.copytree(store, damaged)
    metadata = damaged / "train" / f"{key}.zarr" / "zarr.json"
    text = metadata.read_text()
    metadata.write_text(text[: len(text) // 2] if damage == "truncated" else "not json")
    result = fedhet("train", spec, store=damaged)
    assert result.rc == 1, result.stderr
    assert "Traceback" not in result.stderr and "unexpected" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == (
        f"error: train/{key[:12]}: the stored zarr.json is damaged (unreadable metadata); see "
        f"`fedhet artifacts verify`, then `fedhet artifacts rm {key[:12]}` and recompute it"
    )
    assert not any(line.startswith("error") for line in lines[:-1])
    assert fedhet("artifacts", "rm", key[:12], store=damaged).rc == 0  # what the line says
    assert fedhet("train", spec, store=damaged).rc == 0


def test_verify_names_the_damaged_array(fedhet, trained, tmp_path):
    _, _, key = trained
    damaged = damaged_store(trained, tmp_path, "metrics/test_accuracy")
    result = fedhet("artifacts", "verify", store=damaged)
    assert result.rc == 1
    assert f"train/{key[:12]}: CORRUPT: metrics/test_accuracy: checksum mismatch" in result.stdout


def test_plan_shows_a_damaged_stored_stage_and_how_to_recompute_it(fedhet, trained, tmp_path):
    spec, _, key = trained
    damaged = damaged_store(trained, tmp_path, "model/final/head.weight")
    verified = fedhet("artifacts", "verify", key[:12], store=damaged)
    found = "model/final/head.weight: checksum mismatch"
    assert verified.rc == 1 and f"CORRUPT: {found}" in verified.stdout
    plan = fedhet("plan", spec, "--format", "json", store=damaged)
    assert plan.rc == 0, plan.stderr  # plan tells what is stored; verify is the check that fails
    assert [(r["stage"], r["state"]) for r in json.loads(plan.stdout)] == [
        ("partition", "stored"),
        ("train", f"damaged: {found}"),
    ]
    (line,) = plan.stderr.strip().splitlines()
    assert line == (
        f"warning: train/{key[:12]} is damaged: {found} (`fedhet artifacts verify`); "
        f"`fedhet artifacts rm {key[:12]}`, then `fedhet train {spec}` recomputes it"
    )
    table = fedhet("plan", spec, store=damaged)
    assert "2 stages: 1 stored, 1 damaged" in table.stdout and "Traceback" not in table.stderr
    # what the line says to do recomputes it
    assert fedhet("artifacts", "rm", key[:12], store=damaged).rc == 0
    assert fedhet("train", spec, store=damaged).rc == 0
    assert "2 stages: 2 stored; nothing left to run" in fedhet("plan", spec, store=damaged).stdout


def test_the_apis_plan_shows_damage_in_python_and_removes_what_is_built_on_it(
    trained, tmp_path, capsys
):
    spec, store, key = trained
    damaged = tmp_path / "store"
    shutil.copytree(store, damaged)
    (partition,) = (damaged / "partition").glob("*.zarr")
    metadata = partition / "zarr.json"  # an attribute changed behind the store's back
    metadata.write_text(metadata.read_text().replace('"wall_time_s": ', '"wall_time_s": 1', 1))
    frame = fedhet.load(spec, store=damaged).plan()
    found = "zarr.json: its attributes fail their checksum"
    assert frame["state"].tolist() == [f"damaged: {found}", "stored"]
    assert frame.attrs["summary"].startswith("2 stages: 1 stored, 1 damaged")
    (line,) = capsys.readouterr().err.strip().splitlines()
    call = f"fedhet.load({str(spec)!r}, store={str(damaged)!r})"
    short = partition.name[:12]
    assert line == (
        f"warning: partition/{short} is damaged: {found} (`fedhet artifacts verify`); "
        f"`fedhet.artifacts({str(damaged)!r}).rm({short!r}, cascade=True)`, then `{call}.train()` "
        "recomputes it"
    )


def test_runs_shows_a_damaged_run_as_damaged_with_the_plans_line_from_cli_and_api(
    fedhet, trained, tmp_path, capsys
):
    """A flipped byte in a chunk no result is read from (the final model): `runs` checks the
    checksums as `plan` does, instead of listing the run as stored with its accuracies."""
    spec, _, key = trained
    damaged = damaged_store(trained, tmp_path, "model/final/head.weight")
    found = "model/final/head.weight: checksum mismatch"
    plan = fedhet("plan", spec, store=damaged)
    listed = fedhet("runs", spec, "--format", "json", store=damaged)
    assert listed.rc == 0 and "Traceback" not in listed.stderr
    (row,) = json.loads(listed.stdout)
    assert row["state"] == "damaged" and row["best_test_pct"] is None
    (line,) = listed.stderr.strip().splitlines()
    assert (
        line
        == plan.stderr.strip()
        == (
            f"warning: train/{key[:12]} is damaged: {found} (`fedhet artifacts verify`); "
            f"`fedhet artifacts rm {key[:12]}`, then `fedhet train {spec}` recomputes it"
        )
    )
    table = fedhet("runs", spec, "--state", "damaged", store=damaged).stdout
    assert "damaged" in table and "stored" not in table
    others = fedhet("runs", spec, "--state", "stored", store=damaged)  # lists none: says nothing
    assert others.rc == 0 and others.stderr.strip() == ""
    frame = load(spec, store=damaged).runs()  # the fixture `fedhet` hides the module
    assert frame.state.tolist() == ["damaged"] and frame.best_test_pct.isna().all()
    (said,) = capsys.readouterr().err.strip().splitlines()
    short = key[:12]
    assert said == (
        f"warning: train/{short} is damaged: {found} (`fedhet artifacts verify`); "
        f"`fedhet.artifacts({str(damaged)!r}).rm({short!r})`, then "
        f"`fedhet.load({str(spec)!r}, store={str(damaged)!r}).train()` recomputes it"
    )
    # what the line says to do recomputes it
    assert fedhet("artifacts", "rm", short, store=damaged).rc == 0
    assert fedhet("train", spec, store=damaged).rc == 0
    (row,) = json.loads(fedhet("runs", spec, "--format", "json", store=damaged).stdout)
    assert row["state"] == "stored" and row["best_test_pct"] > 10


class StopAfter:
    """A progress sink that interrupts the run, as SIGINT would, once `rounds` are done."""

    def __init__(self, rounds: int):
        self.rounds = rounds

    def __call__(self, key: str, done: int, total: int, accuracy: float) -> None:
        if done == self.rounds:
            raise Interrupted(signal.SIGINT)


@pytest.mark.parametrize("target", ["global", "delta"])
def test_a_damaged_newest_checkpoint_is_skipped_and_the_run_still_equals_the_uninterrupted(
    fedhet, trained, tmp_path, target
):
    spec_path, reference_store, key = trained
    (run,) = runs_of(load_spec(spec_path))
    store = ArtifactStore(tmp_path / "store")
    context = RunContext(run.spec, store, Console(stderr=True, quiet=True), progress=StopAfter(4))
    with pytest.raises(Interrupted):
        ensure(run.node, context)
    partial = store.partial_dir("train", key)
    (checkpoint,) = partial.glob("ckpt-*.zarr")
    assert zarr.open_group(checkpoint, mode="r").attrs["round"] == 3
    if target == "global":
        flip_a_byte(next(p for p in sorted((checkpoint / "global").iterdir()) if p.is_dir()))
    else:
        delta = sorted(partial.glob("clients-*.zarr"))[-1]
        flip_a_byte(next((delta / "clients" / "values").iterdir()))

    result = fedhet("train", spec_path, store=store.root)
    assert result.rc == 0, result.stderr
    lines = result.stderr.splitlines()
    skipped = [line for line in lines if "damaged" in line]
    assert len(skipped) == 1
    assert skipped[0].startswith(
        f"train {key[:12]}: skipped the damaged checkpoint {checkpoint.name}"
    )
    assert skipped[0].endswith("checksum mismatch")
    # where the run starts is said once, after the skip, and truly: round 0, not round 4
    starts = [line for line in lines if key[:12] in line and "damaged" not in line]
    assert starts == [f"train {key[:12]}: computing (SCAFFOLD, alpha=0.5, seed 3)"]
    assert lines.index(skipped[0]) < lines.index(starts[0])
    ours = store.open("train", key)
    reference = ArtifactStore(reference_store).open("train", key)
    expected = {n: np.asarray(a[...]) for n, a in arrays(reference) if "wall_time" not in n}
    found = {n: np.asarray(a[...]) for n, a in arrays(ours) if "wall_time" not in n}
    assert found.keys() == expected.keys()
    for name, values in expected.items():
        assert found[name].tobytes() == values.tobytes(), name
