"""Every stored fact under a checksum (issue 43): an attribute a result depends on (a tune's
scores and choice, a run's summary) changed in valid JSON, or the metadata of an array (metrics,
partition, checkpoint) missing or edited, is found by the next read, from every command and the
API, in one line naming the artifact and the member (`runs` and `plan` list such a run as
damaged, with no results, and go on), and by `fedhet artifacts verify`; nothing is filled with
blanks or NaN, and the store is left as it was. Artifacts written before these
checksums read as before."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import CliResult, CliRunner, write_spec
from rich.console import Console
from test_checksums import StopAfter

from fedhet.api import load
from fedhet.core import divergence
from fedhet.core.errors import DamagedArtifactError, DivergedError
from fedhet.core.pipeline import RunContext, ensure
from fedhet.core.sealed import ATTRIBUTES_CHECKSUM, METADATA_CHECKSUMS, arrays
from fedhet.core.spec import load_spec
from fedhet.core.store import ArtifactStore
from fedhet.execution.planning import runs_of
from fedhet.process.interrupts import Interrupted

SPEC: dict[str, Any] = {
    "name": "facts",
    "data": {"dataset": "digits", "validation": 0.2},
    "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.5},
    "model": {"arch": "mlp", "hidden": [16]},
    "federation": {"rounds": 3, "batch_size": 32, "lr": 0.05},
    "runtime": {"threads": 1, "progress": False, "checkpoint_every": 1},
    "matrix": {"algorithm": [{"name": "fedavg"}], "seed": [0]},
    "tune": {"trials": 2, "seeds": [7], "space": {"federation.lr": {"grid": [0.05, 0.2]}}},
}


class Stored:
    """A store holding a tune (its trials' runs too) and the spec's own run."""

    def __init__(self, spec: Path, store: Path):
        self.spec, self.store = spec, store
        (run,) = runs_of(load_spec(spec))
        self.train, self.partition = run.node.key, run.node.upstream["partition"].key
        (self.tune,) = [a.key for a in ArtifactStore(store).ls() if a.stage == "tune"]

    def copy(self, folder: Path) -> Path:
        shutil.copytree(self.store, folder / "store")
        return folder / "store"


@pytest.fixture(scope="module")
def stored(fedhet: CliRunner, tmp_path_factory: pytest.TempPathFactory) -> Stored:
    root = tmp_path_factory.mktemp("facts")
    spec, store = write_spec(root / "facts.yaml", SPEC), root / "store"
    assert fedhet("tune", spec, store=store).rc == 0
    assert fedhet("train", spec, store=store).rc == 0
    return Stored(spec, store)


def damage_line(stage: str, key: str, member: str, why: str) -> str:
    return (
        f"error: {stage}/{key[:12]}: the stored {member} is damaged ({why}); see `fedhet "
        f"artifacts verify`, then `fedhet artifacts rm {key[:12]}` and recompute it"
    )


def assert_one_line(result: CliResult, line: str) -> None:
    """Exit 1 and `line` as the last line of stderr, the only one saying `error`."""
    assert result.rc == 1, result.stderr
    assert "Traceback" not in result.stderr and "unexpected" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == line
    assert not any(other.startswith("error") for other in lines[:-1]), result.stderr


def assert_listed_damaged(fedhet: CliRunner, stored: Stored, store: Path, found: str) -> None:
    """`runs` (CLI and API) lists the run as damaged, with no results, and says in one line
    what is damaged (`found`: member and why), as `plan` does; exit 0: the listing is whole."""
    listed = fedhet("runs", stored.spec, "--format", "json", store=store)
    assert listed.rc == 0 and "Traceback" not in listed.stderr, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert row["state"] == "damaged" and row["best_test_pct"] is None
    (line,) = listed.stderr.strip().splitlines()
    assert line.startswith(f"warning: train/{stored.train[:12]} is damaged: {found} ("), line
    frame = load(stored.spec, store=store).runs()
    assert frame.state.tolist() == ["damaged"] and frame.best_test_pct.isna().all()


def results(store: Path) -> dict[str, str]:
    """sha256 of every file of every stored artifact."""
    return {
        str(path.relative_to(store)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(store.glob("*/*.zarr/**/*"))
        if path.is_file()
    }


def edit_attributes(folder: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Change the attributes of the group in `folder`, its metadata staying valid JSON."""
    metadata = json.loads((folder / "zarr.json").read_text())
    change(metadata["attributes"])
    (folder / "zarr.json").write_text(json.dumps(metadata, indent=2))


def a_digit_changed(value: float) -> float:
    text = repr(value)
    return float(text[:-1] + str((int(text[-1]) + 1) % 10))


def change_a_score(attrs: dict[str, Any]) -> None:
    trial = attrs["tune"]["selections"][0]["trials"][0]
    trial["scores"][0] = a_digit_changed(trial["scores"][0])


def change_the_choice(attrs: dict[str, Any]) -> None:
    selection = attrs["tune"]["selections"][0]
    selection["chosen"] = 1 - selection["chosen"]


@pytest.mark.parametrize("change", [change_a_score, change_the_choice])
def test_a_changed_tune_score_or_choice_is_found_by_every_reader(
    fedhet: CliRunner, stored: Stored, tmp_path: Path, change
):
    store = stored.copy(tmp_path)
    edit_attributes(store / "tune" / f"{stored.tune}.zarr", change)
    before = results(store)
    line = damage_line("tune", stored.tune, "zarr.json", "its attributes fail their checksum")
    assert_one_line(fedhet("tune", stored.spec, store=store), line)
    reports = tmp_path / "reports"
    tuned = fedhet("report", stored.spec, "--tuned", "--train", "--out", reports, store=store)
    assert_one_line(tuned, line)
    assert not reports.exists()
    verify = fedhet("artifacts", "verify", store=store)
    assert verify.rc == 1
    assert (
        f"tune/{stored.tune[:12]}: CORRUPT: zarr.json: its attributes fail their checksum"
        in verify.stdout.splitlines()
    )
    assert results(store) == before


def test_a_changed_run_summary_is_found_by_every_reader(
    fedhet: CliRunner, stored: Stored, tmp_path: Path
):
    store = stored.copy(tmp_path)

    def change(attrs: dict[str, Any]) -> None:
        attrs["summary"]["best_test"] = a_digit_changed(attrs["summary"]["best_test"])

    edit_attributes(store / "train" / f"{stored.train}.zarr", change)
    before = results(store)
    line = damage_line("train", stored.train, "zarr.json", "its attributes fail their checksum")
    for command in (["export"], ["report", "--out", tmp_path / "reports"]):
        assert_one_line(fedhet(command[0], stored.spec, *command[1:], store=store), line)
    with pytest.raises(DamagedArtifactError) as raised:
        load(stored.spec, store=store).metrics()
    assert f"error: {raised.value}" == line
    assert_listed_damaged(fedhet, stored, store, "zarr.json: its attributes fail their checksum")
    assert f"train/{stored.train[:12]}: CORRUPT: zarr.json" in _verify(fedhet, store)
    assert results(store) == before


def _verify(fedhet: CliRunner, store: Path) -> str:
    result = fedhet("artifacts", "verify", store=store)
    assert result.rc == 1 and "Traceback" not in result.stderr
    return result.stdout


def test_any_change_to_any_stored_attribute_is_found_by_the_next_read(
    stored: Stored, tmp_path: Path
):
    store = ArtifactStore(stored.copy(tmp_path))
    one_per_stage = {info.stage: info for info in store.ls()}
    assert one_per_stage.keys() == {"partition", "train", "tune"}
    for info in one_per_stage.values():
        original = (info.path / "zarr.json").read_bytes()
        for name in info.attrs:
            edit_attributes(info.path, lambda attrs, name=name: _change(attrs, name))
            for read in (store.attrs, store.open):
                with pytest.raises(DamagedArtifactError, match="attributes fail their checksum"):
                    read(info.stage, info.key)
            problems = store.verify(info.stage, info.key)
            assert problems[0] == "zarr.json: its attributes fail their checksum", name
            (info.path / "zarr.json").write_bytes(original)
        assert store.verify(info.stage, info.key) == []


def _change(attrs: dict[str, Any], name: str) -> None:
    value = attrs[name]
    if isinstance(value, dict):
        attrs[name] = {**value, "added": 1}
    elif isinstance(value, list):
        attrs[name] = [*value, 1]
    elif isinstance(value, str):
        attrs[name] = value + "0"
    else:
        attrs[name] = value + 1


def delete(metadata: Path) -> None:
    metadata.unlink()


def truncate(metadata: Path) -> None:
    text = metadata.read_text()
    metadata.write_text(text[: len(text) // 2])


def edit_the_dtype(metadata: Path) -> None:
    document = json.loads(metadata.read_text())
    assert document["data_type"] == "float64"
    metadata.write_text(json.dumps({**document, "data_type": "float32"}, indent=2))


METADATA_DAMAGE = [
    (delete, "metadata missing"),
    (truncate, "metadata changed: checksum mismatch"),
    (edit_the_dtype, "metadata changed: checksum mismatch"),
]


@pytest.mark.parametrize(("damage", "why"), METADATA_DAMAGE)
def test_damaged_metrics_metadata_is_one_line_from_every_reader_and_the_api(
    fedhet: CliRunner, stored: Stored, tmp_path: Path, damage, why
):
    store = stored.copy(tmp_path)
    damage(store / "train" / f"{stored.train}.zarr" / "metrics" / "test_accuracy" / "zarr.json")
    before = results(store)
    line = damage_line("train", stored.train, "metrics/test_accuracy", why)
    for command in (["export"], ["report", "--out", tmp_path / "reports"]):
        assert_one_line(fedhet(command[0], stored.spec, *command[1:], store=store), line)
    with pytest.raises(DamagedArtifactError) as raised:
        load(stored.spec, store=store).metrics()
    assert f"error: {raised.value}" == line
    assert_listed_damaged(fedhet, stored, store, f"metrics/test_accuracy: {why}")
    found = f"train/{stored.train[:12]}: CORRUPT: metrics/test_accuracy: {why}"
    assert found in _verify(fedhet, store).splitlines()
    assert results(store) == before


def test_damaged_partition_metadata_is_one_line(fedhet: CliRunner, stored: Stored, tmp_path: Path):
    store = stored.copy(tmp_path)
    truncate(store / "partition" / f"{stored.partition}.zarr" / "indices" / "zarr.json")
    before = results(store)
    line = damage_line(
        "partition", stored.partition, "indices", "metadata changed: checksum mismatch"
    )
    assert_one_line(fedhet("train", stored.spec, "algorithm.name=fedprox", store=store), line)
    found = f"partition/{stored.partition[:12]}: CORRUPT: indices: metadata changed"
    assert found in _verify(fedhet, store)
    assert results(store) == before


def an_array_metadata_deleted(checkpoint: Path) -> tuple[str, str]:
    member = sorted(p for p in (checkpoint / "global").iterdir() if p.is_dir())[0]
    (member / "zarr.json").unlink()
    return f"global/{member.name}", "metadata missing"


def its_round_changed(checkpoint: Path) -> tuple[str, str]:
    edit_attributes(checkpoint, lambda attrs: attrs.update(round=attrs["round"] - 1))
    return "zarr.json", "its attributes fail their checksum"


@pytest.mark.parametrize("damage", [an_array_metadata_deleted, its_round_changed])
def test_a_damaged_checkpoint_is_skipped_in_one_line_and_the_run_equals_the_uninterrupted(
    fedhet: CliRunner, stored: Stored, tmp_path: Path, damage
):
    (run,) = runs_of(load_spec(stored.spec))
    store = ArtifactStore(tmp_path / "store")
    context = RunContext(run.spec, store, Console(stderr=True, quiet=True), progress=StopAfter(2))
    with pytest.raises(Interrupted):
        ensure(run.node, context)
    (checkpoint,) = store.partial_dir("train", stored.train).glob("ckpt-*.zarr")
    member, why = damage(checkpoint)

    result = fedhet("train", stored.spec, store=store.root)
    assert result.rc == 0, result.stderr
    skipped = [line for line in result.stderr.splitlines() if "damaged" in line]
    assert skipped == [
        f"train {stored.train[:12]}: skipped the damaged checkpoint {checkpoint.name} "
        f"({checkpoint.name}/{member}): {why}"
    ]
    ours = store.open("train", stored.train)
    reference = ArtifactStore(stored.store).open("train", stored.train)
    expected = {n: np.asarray(a[...]) for n, a in arrays(reference) if "wall_time" not in n}
    found = {n: np.asarray(a[...]) for n, a in arrays(ours) if "wall_time" not in n}
    assert found.keys() == expected.keys()
    for name, values in expected.items():
        assert found[name].tobytes() == values.tobytes(), name


def unseal(store: Path) -> None:
    """Make every artifact as fedhet wrote it before attribute and metadata checksums."""
    for folder in store.glob("*/*.zarr"):
        edit_attributes(folder, _without_the_checksums)


def _without_the_checksums(attrs: dict[str, Any]) -> None:
    del attrs[ATTRIBUTES_CHECKSUM], attrs[METADATA_CHECKSUMS]


def test_an_artifact_written_before_the_checksums_reads_as_before(
    fedhet: CliRunner, stored: Stored, tmp_path: Path
):
    sealed = fedhet("export", stored.spec, store=stored.store)
    store = stored.copy(tmp_path)
    unseal(store)
    old = fedhet("export", stored.spec, store=store)
    assert old.rc == 0 and old.stdout == sealed.stdout
    verify = fedhet("artifacts", "verify", store=store)
    assert verify.rc == 0
    lines = verify.stdout.splitlines()
    assert len(lines) == 6
    assert all(line.endswith(": ok (no attribute checksum: an older artifact)") for line in lines)


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (delete, "metadata missing"),
        (truncate, "unreadable metadata"),
        (edit_the_dtype, "unreadable chunk (cannot reshape array of size 6 into shape (3,))"),
    ],
)
def test_damaged_metadata_of_an_older_artifact_is_one_line_too(
    fedhet: CliRunner, stored: Stored, tmp_path: Path, damage, why
):
    store = stored.copy(tmp_path)
    unseal(store)
    damage(store / "train" / f"{stored.train}.zarr" / "metrics" / "test_accuracy" / "zarr.json")
    line = damage_line("train", stored.train, "metrics/test_accuracy", why)
    assert_one_line(fedhet("export", stored.spec, store=store), line)
    with pytest.raises(DamagedArtifactError) as raised:
        load(stored.spec, store=store).metrics()
    assert f"error: {raised.value}" == line


def test_a_changed_divergence_record_is_found_and_an_older_one_reads_as_before(tmp_path: Path):
    partial = tmp_path / "train" / f"{'ab' * 32}.partial"
    divergence.record(partial, DivergedError("diverged", 3, {"test_accuracy": [0.5, math.nan]}))
    assert divergence.recorded(partial).metrics["test_accuracy"][0] == 0.5
    marker = partial / divergence.MARKER
    content = json.loads(marker.read_text())
    content["metrics"]["test_accuracy"][0] = 0.625
    marker.write_text(json.dumps(content))
    with pytest.raises(DamagedArtifactError) as raised:
        divergence.recorded(partial)
    assert f"error: {raised.value}" == damage_line(
        "train", "ab" * 32, "diverged.json", "checksum mismatch"
    )
    del content[divergence.CHECKSUM]  # as recorded before the checksum
    marker.write_text(json.dumps(content))
    assert divergence.recorded(partial).metrics["test_accuracy"][0] == 0.625
