"""The data a run trains on are the data its key names, and bad inputs are refused at validation
(issue 43's probes): a data file replaced between planning and loading stops the train in one
line naming it (nothing is stored under the old file's key, and `plan` calls nothing computed
on other bytes stored); values past float32, zero-byte, non-zip and empty files, too many
classes, oversized images and booleans for counts are refused in one line naming the field and
the file (exit 2, also from `fedhet.load`); unused arrays get one warning."""

from __future__ import annotations

import hashlib
import json
import pickle
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from conftest import REPO, CliRunner, cli_env, write_spec
from sklearn.datasets import load_digits

from fedhet import load as fedhet_load
from fedhet.core.data_config import ArrayData, DataConfig, DataInfo
from fedhet.core.errors import InputError
from fedhet.core.spec import parse_spec
from fedhet.core.store import ArtifactStore
from fedhet.data.datasets import load_data
from fedhet.data.partition_plan import partition_node
from fedhet.execution.planning import runs_of
from fedhet.execution.tasks import plan_tasks


def digits_npz(path: Path, **changes: np.ndarray) -> Path:
    digits = load_digits()
    np.savez(path, **({"x": digits.images.astype(np.float32) / 16, "y": digits.target} | changes))
    return path


def spec_of(path: str, **sections) -> dict:
    return {
        "name": "mine",
        "data": {"dataset": "arrays", "path": path},
        "partition": {"scheme": "iid", "clients": 4},
        "model": {"arch": "mlp", "hidden": [16]},
        "federation": {"rounds": 2, "batch_size": 32, "lr": 0.05},
        "runtime": {"threads": 1, "progress": False},
    } | sections


THREE_RUNS = {"algorithm": [{"name": "fedavg"}, {"name": "scaffold"}, {"name": "fedprox"}]}

# `fedhet ARGS` whose data file is replaced by REPLACEMENT at a set point: once the first run is
# stored (in order), or once every node is planned (--jobs). Deterministic: no timing involved.
REPLACING = """
import shutil, sys
import fedhet.execution.sweep as sweep
import fedhet.execution.train as train
from fedhet.cli import main

replacement, sys.argv = sys.argv[1], ["fedhet", *sys.argv[2:]]
stored = []


def execute(run, store, original=train.execute):
    group = original(run, store)
    stored.append(run)
    if len(stored) == 1:
        shutil.copy(replacement, "mine.npz")
    return group


def plan_tasks(runs, root, original=sweep.plan_tasks):
    tasks = original(runs, root)
    shutil.copy(replacement, "mine.npz")
    return tasks


if __name__ == "__main__":  # not in the workers' forkserver, which imports this file too
    train.execute, sweep.plan_tasks = execute, plan_tasks
    main()
"""


def fedhet_replacing(folder: Path, replacement: Path, *args: str) -> subprocess.CompletedProcess:
    script = folder / "replacing.py"
    script.write_text(REPLACING)
    command = [sys.executable, str(script), str(replacement), *args]
    return subprocess.run(command, cwd=folder, env=cli_env(), capture_output=True, text=True)


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    (line,) = stderr.strip("\n").splitlines()
    return line


def one_error(stderr: str) -> str:
    """The one `error:` line among a train's progress lines."""
    assert "Traceback" not in stderr, stderr
    (line,) = [line for line in stderr.splitlines() if line.startswith("error:")]
    return line


def stored_metrics(store: Path) -> dict[str, dict[str, list[float]]]:
    """Every stored train artifact's metrics (but its wall time), by key."""
    groups = {p.stem: ArtifactStore(store).open("train", p.stem) for p in store.glob("train/*")}
    return {
        key: {
            name: array[:].tolist()
            for name, array in group["metrics"].arrays()
            if name != "wall_time"
        }
        for key, group in groups.items()
    }


def planned_states(fedhet: CliRunner, spec: Path, store: Path, folder: Path) -> list[str]:
    result = fedhet("plan", spec, "--store", store, "--format", "json", cwd=folder)
    assert result.rc == 0, result.stderr
    return [row["state"] for row in json.loads(result.stdout) if row["stage"] == "train"]


def test_a_file_replaced_between_planning_and_loading_stops_the_train_naming_it(
    fedhet: CliRunner, tmp_path: Path
):
    original = digits_npz(tmp_path / "original.npz")
    other = digits_npz(tmp_path / "other.npz", y=np.roll(load_digits().target, 1))
    shutil.copy(original, tmp_path / "mine.npz")
    spec = write_spec(tmp_path / "mine.yaml", spec_of("mine.npz", matrix=THREE_RUNS))
    store = tmp_path / "store"

    result = fedhet_replacing(tmp_path, other, "train", spec.name, "--store", str(store))
    assert result.returncode == 2
    line = one_error(result.stderr)
    assert line.startswith("error: data.path: mine.npz changed while fedhet was using it"), line
    assert len(stored_metrics(store)) == 1  # the first run, trained and keyed on the original
    assert planned_states(fedhet, spec, store, tmp_path) == ["missing"] * 3  # the new bytes'

    shutil.copy(original, tmp_path / "mine.npz")  # put back: its first run is the stored one
    assert planned_states(fedhet, spec, store, tmp_path) == ["stored", "missing", "missing"]
    fresh = tmp_path / "fresh"
    first = ("--only", "algorithm=fedavg")
    assert fedhet("train", spec, *first, "--store", fresh, cwd=tmp_path).rc == 0
    assert stored_metrics(store) == stored_metrics(fresh)


def test_a_file_replaced_before_the_workers_load_it_stores_nothing(tmp_path: Path):
    digits_npz(tmp_path / "mine.npz")
    other = digits_npz(tmp_path / "other.npz", y=np.roll(load_digits().target, 1))
    spec = write_spec(tmp_path / "mine.yaml", spec_of("mine.npz", matrix=THREE_RUNS))
    store = tmp_path / "store"
    result = fedhet_replacing(
        tmp_path, other, "train", spec.name, "--store", str(store), "--jobs", "2"
    )
    assert result.returncode == 1
    assert "data.path: mine.npz changed while fedhet was using it" in one_error(result.stderr)
    assert stored_metrics(store) == {}


def test_an_image_folder_changed_after_planning_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    Image = pytest.importorskip("PIL.Image")
    monkeypatch.chdir(tmp_path)
    for label in ("cat", "dog"):
        (tmp_path / "scans" / label).mkdir(parents=True)
        for i in range(3):
            grey = np.full((8, 8), 60 * i + 100 * (label == "dog"), np.uint8)
            Image.fromarray(grey).save(tmp_path / "scans" / label / f"{i}.png")
    spec = parse_spec(spec_of("scans") | {"data": {"dataset": "images", "path": "scans"}})
    planned = partition_node(spec).key
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / "scans" / "cat" / "3.png")
    with pytest.raises(InputError, match="data.path: scans changed while fedhet was using it"):
        load_data(spec.data, seed=spec.seed)
    assert partition_node(parse_spec(spec.model_dump(mode="json"))).key != planned


def test_a_task_planned_on_one_file_is_refused_by_a_worker_that_reads_another(tmp_path: Path):
    """A worker plans its task again from the spec: on the data identity the parent planned."""
    path = digits_npz(tmp_path / "mine.npz")
    spec = parse_spec(spec_of(str(path)) | {"algorithm": {"name": "fedavg"}})
    tasks = plan_tasks(runs_of(spec), str(tmp_path / "store"))
    sent = [pickle.dumps(task) for task in tasks.values()]  # as a pool sends them
    digits_npz(path, y=np.roll(load_digits().target, 1))
    for task in sent:
        with pytest.raises(InputError, match=f"data.path: {re.escape(str(path))} changed while"):
            pickle.loads(task)


class HashedFile(DataConfig):
    """A plug-in dataset whose identity is its file's content hash."""

    loader: ClassVar[str] = f"{__name__}:load_hashed"
    hashed_files: ClassVar[dict[str, str]] = {"sha256": "file"}
    dataset: str = "hashed"
    file: str

    def describe(self) -> DataInfo:
        return DataInfo((1, 1, 2), 2)

    def identity(self) -> dict[str, Any]:
        return {"sha256": hashlib.sha256(Path(self.file).read_bytes()).hexdigest()}


def load_hashed(config: HashedFile, seed: int) -> ArrayData:
    x = np.load(config.file).astype(np.float32)
    return ArrayData(x, np.array([0, 1]), x, np.array([0, 1]))


def test_a_plugin_dataset_hashed_by_content_is_refused_when_its_file_changes(tmp_path: Path):
    np.save(tmp_path / "blob.npy", np.eye(2))
    config = HashedFile(file=str(tmp_path / "blob.npy"))
    planned = config.keyed_identity()  # as planning keys it
    np.save(tmp_path / "blob.npy", 2 * np.eye(2))
    with pytest.raises(InputError, match=r"data.file: .*blob.npy changed while fedhet was using"):
        load_data(config, seed=0)
    np.save(tmp_path / "blob.npy", np.eye(2))  # put back: loads, as planned
    assert load_data(config, seed=0).train_x.sum() == 2 and config.keyed_identity() == planned


def big_png(path: Path, width: int, height: int) -> Path:
    """A PNG whose header says width x height grey pixels (Pillow refuses it at its header)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b""))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png + chunk(b"IEND", b""))
    return path


def overflowing(folder: Path) -> Path:
    x = load_digits().images.astype(np.float64)
    x[5, 0, 0] = 1e39  # finite in float64, infinite in float32
    return digits_npz(folder / "mine.npz", x=x)


def zero_bytes(folder: Path) -> Path:
    (folder / "mine.npz").write_bytes(b"")
    return folder / "mine.npz"


def text(folder: Path) -> Path:
    (folder / "mine.npz").write_text("x,y\n0.5,1\n")
    return folder / "mine.npz"


def no_samples(folder: Path) -> Path:
    return digits_npz(folder / "mine.npz", x=np.zeros((0, 8, 8), np.float32), y=np.zeros(0, int))


def many_labels(folder: Path) -> Path:
    y = load_digits().target.copy()
    y[0] = 50_000
    return digits_npz(folder / "mine.npz", y=y)


def bomb(folder: Path) -> Path:
    Image = pytest.importorskip("PIL.Image")
    for label in ("cat", "dog"):
        (folder / "scans" / label).mkdir(parents=True)
        Image.fromarray(np.full((8, 8), 100, np.uint8)).save(folder / "scans" / label / "a.png")
    big_png(folder / "scans" / "cat" / "b.png", 14_000, 13_000)  # 182 Mpixel
    return folder / "scans"


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (overflowing, "data.path: x holds values up to 1e+39 in magnitude, past float32's range"),
        (zero_bytes, "data.path: an empty file (0 bytes)"),
        (text, "data.path: not a .npz archive (the zip of arrays that np.savez writes)"),
        (no_samples, "data.path: x holds no samples (shape (0, 8, 8))"),
        (
            many_labels,
            "data.path: 50,001 classes (labels up to 50000), past fedhet's limit of 10,000",
        ),
        (bomb, "data.path: scans/cat/b.png: over 89,478,485 pixels, more than fedhet reads"),
    ],
)
def test_bad_data_is_refused_at_validation_naming_the_field_and_the_file(
    fedhet: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make, expected
):
    path = make(tmp_path).name
    data = {"dataset": "images", "path": path, "size": 8} if make is bomb else {"path": path}
    spec = spec_of(path)
    spec["data"] |= data
    write_spec(tmp_path / "mine.yaml", spec)
    for command in ("spec", "validate"), ("train",):
        result = fedhet(*command, "mine.yaml", store=tmp_path / "store", cwd=tmp_path)
        assert result.rc == 2, result.stderr
        line = one_line(result.stderr)
        assert line.startswith(f"error: mine.yaml: {expected}") and path in line, line
    assert not (tmp_path / "store").exists()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=re.escape(expected)):
        fedhet_load(spec)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("federation.rounds=true", "federation.rounds"),
        ("federation.clients_per_round=true", "federation.clients_per_round"),
        ("federation.local_epochs=true", "federation.local_epochs"),
        ("federation.batch_size=false", "federation.batch_size"),
        ("partition.clients=true", "partition.clients"),
        ("eval.every=true", "eval.every"),
        ("seed=true", "seed"),
        ("model.hidden=[16, true]", "model.hidden.1"),
        ("algorithm={name: tct, stage1: {rounds: true}}", "algorithm.stage1.rounds"),
    ],
)
def test_a_boolean_for_a_count_is_refused(
    fedhet: CliRunner, tmp_path: Path, override: str, field: str
):
    spec = write_spec(tmp_path / "s.yaml", spec_of("mine.npz") | {"data": {"dataset": "digits"}})
    for command in ("spec", "validate"), ("train",):
        result = fedhet(*command, spec, override, store=tmp_path / "store")
        assert result.rc == 2
        assert f"{field}: input should be a valid" in one_line(result.stderr)
    with pytest.raises(InputError, match=f"{re.escape(field)}: input should be a valid"):
        fedhet_load(spec, override)


def test_unused_arrays_get_one_warning_naming_them(fedhet: CliRunner, tmp_path: Path):
    digits_npz(tmp_path / "mine.npz", weights=np.ones(3), meta=np.zeros(2))
    spec = write_spec(tmp_path / "mine.yaml", spec_of("mine.npz", matrix=THREE_RUNS))
    result = fedhet("spec", "validate", spec, cwd=tmp_path)
    assert result.rc == 0, result.stderr
    assert one_line(result.stderr) == (
        "warning: mine.npz: arrays weights, meta are not used (fedhet reads x, y, client); "
        "leave them out to silence this"
    )


def test_an_eof_error_is_a_failure_not_an_interrupt(tmp_path: Path):
    """click turns EOFError, like Ctrl-C, into Abort; only Ctrl-C is an interrupt (130)."""
    crash = (
        "import sys, fedhet.cli, fedhet.execution.loading as loading\n"
        "def load(*args, **kwargs): raise EOFError('No data left in file')\n"
        "loading.load_spec = load\n"
        "sys.argv = ['fedhet', 'spec', 'validate', 'any.yaml']\n"
        "fedhet.cli.main()\n"
    )
    env = cli_env(FEDHET_CRASH_DIR=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "-c", crash], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert result.returncode == 1
    assert one_line(result.stderr).startswith("error: unexpected EOFError at")
