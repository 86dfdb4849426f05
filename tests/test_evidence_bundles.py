"""tools/evidence.sh carries a store's results (and only its results) between machines: a bundle
restores them byte for byte, a second bundle holds only what the first did not, and the
committed bundles are each described in evidence/README.md."""

import filecmp
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _store(root: Path) -> Path:
    store = root / "store"
    for path, text in {
        "partition/p1.zarr/zarr.json": "{}",
        "train/r1.zarr/zarr.json": "{}",
        "train/r1.zarr/metrics/c/0": "0.5",
        "train/r2.partial/diverged.json": '{"round": 3}',
        "train/r2.partial/checkpoint/zarr.json": "{}",
        "train/r3.lock": "",
        "train/r3.zarr.tmp-12-ab/zarr.json": "{}",
    }.items():
        (store / path).parent.mkdir(parents=True, exist_ok=True)
        (store / path).write_text(text)
    return store


def _evidence(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(root / "tools" / "evidence.sh"), *args],
        capture_output=True,
        text=True,
    )


def _members(bundle: Path) -> set[str]:
    listing = subprocess.run(["tar", "-tJf", str(bundle)], capture_output=True, text=True)
    return {name.rstrip("/") for name in listing.stdout.split()}


def test_a_bundle_carries_the_results_and_restores_them_byte_for_byte(tmp_path):
    (tmp_path / "tools").mkdir()
    shutil.copy(REPO / "tools" / "evidence.sh", tmp_path / "tools")
    store = _store(tmp_path)

    done = _evidence(tmp_path, "bundle", "first", str(store))
    assert done.returncode == 0, done.stderr
    members = _members(tmp_path / "evidence" / "first.tar.xz")
    assert {
        "partition/p1.zarr",
        "train/r1.zarr/metrics/c/0",
        "train/r2.partial/diverged.json",
    } <= members
    assert not {m for m in members if "checkpoint" in m or ".lock" in m or ".tmp-" in m}

    (store / "train/r4.zarr").mkdir()
    (store / "train/r4.zarr/zarr.json").write_text("{}")
    assert _evidence(tmp_path, "bundle", "second", str(store)).returncode == 0
    assert _members(tmp_path / "evidence" / "second.tar.xz") == {
        "train/r4.zarr",
        "train/r4.zarr/zarr.json",
    }
    nothing = _evidence(tmp_path, "bundle", "third", str(store))
    assert nothing.returncode == 0 and "no result" in nothing.stdout
    assert not (tmp_path / "evidence" / "third.tar.xz").exists()

    restored = tmp_path / "restored"
    assert _evidence(tmp_path, "restore", str(restored)).returncode == 0
    for result in ["partition/p1.zarr", "train/r1.zarr", "train/r4.zarr"]:
        comparison = filecmp.dircmp(store / result, restored / result)
        assert not (comparison.diff_files or comparison.left_only or comparison.right_only)
    assert (restored / "train/r2.partial/diverged.json").read_text() == '{"round": 3}'
    assert not (restored / "train/r3.lock").exists()


def test_a_bundle_name_is_never_reused_and_bad_arguments_are_refused(tmp_path):
    (tmp_path / "tools").mkdir()
    shutil.copy(REPO / "tools" / "evidence.sh", tmp_path / "tools")
    store = _store(tmp_path)
    assert _evidence(tmp_path, "bundle", "first", str(store)).returncode == 0
    again = _evidence(tmp_path, "bundle", "first", str(store))
    assert again.returncode == 2 and "exists" in again.stderr
    assert _evidence(tmp_path, "bundle", "a b", str(store)).returncode == 2
    assert _evidence(tmp_path, "pack").returncode == 2


def test_every_committed_bundle_is_described():
    readme = (REPO / "evidence" / "README.md").read_text()
    for bundle in sorted((REPO / "evidence").glob("*.tar.xz")):
        assert f"`{bundle.name}`" in readme, f"evidence/README.md does not describe {bundle.name}"
