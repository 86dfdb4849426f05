"""tools/evidence.sh carries a store's results (and only its results) between machines: a bundle
restores them byte for byte, whole, and never over a result the store holds; a second bundle
holds only what the first did not; bad input is refused in one line; and the committed bundles
are each described in evidence/README.md."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STORE = {
    "partition/p1.zarr/zarr.json": "{}",
    "train/r1.zarr/zarr.json": "{}",
    "train/r1.zarr/metrics/c/0": "0.5",
    "train/r2.partial/diverged.json": '{"round": 3}',
    "train/r2.partial/checkpoint/zarr.json": "{}",  # a checkpoint: not a result
    "train/r3.lock": "",
    "train/r3.zarr.tmp-12-ab/zarr.json": "{}",  # a writer's temporary
    "train/r5.zarr/metrics/c/0": "1",  # no zarr.json: what an interrupted rm leaves
}


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def _write(root: Path, files: dict[str, str]) -> Path:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A folder with tools/evidence.sh, whose bundles go to its evidence/."""
    (tmp_path / "tools").mkdir()
    shutil.copy(REPO / "tools" / "evidence.sh", tmp_path / "tools")
    return tmp_path


def _evidence(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(repo / "tools" / "evidence.sh"), *args], capture_output=True, text=True
    )


def _members(bundle: Path) -> set[str]:
    listing = subprocess.run(["tar", "-tJf", str(bundle)], capture_output=True, text=True)
    assert listing.returncode == 0, listing.stderr
    return {name.rstrip("/") for name in listing.stdout.splitlines()}


def test_a_bundle_carries_the_results_and_restores_them_byte_for_byte(repo: Path):
    store = _write(repo / "my store", STORE)  # a path with a space
    done = _evidence(repo, "bundle", "first", str(store))
    assert done.returncode == 0, done.stderr
    members = _members(repo / "evidence" / "first.tar.xz")
    assert members == {
        "partition/p1.zarr",
        "partition/p1.zarr/zarr.json",
        "train/r1.zarr",
        "train/r1.zarr/zarr.json",
        "train/r1.zarr/metrics",
        "train/r1.zarr/metrics/c",
        "train/r1.zarr/metrics/c/0",
        "train/r2.partial/diverged.json",
    }

    _write(store, {"train/r4.zarr/zarr.json": "{}"})
    assert _evidence(repo, "bundle", "second", str(store)).returncode == 0
    assert _members(repo / "evidence" / "second.tar.xz") == {
        "train/r4.zarr",
        "train/r4.zarr/zarr.json",
    }
    nothing = _evidence(repo, "bundle", "third", str(store))
    assert nothing.returncode == 0 and "no result" in nothing.stdout
    assert not (repo / "evidence" / "third.tar.xz").exists()

    restored = repo / "restored"
    done = _evidence(repo, "restore", str(restored))
    assert done.returncode == 0, done.stderr
    assert "first.tar.xz: 3 results restored" in done.stdout
    results = {
        k: v
        for k, v in _files(store).items()
        if k.startswith(("partition/", "train/r1", "train/r4"))
    }
    assert _files(restored) == results | {"train/r2.partial/diverged.json": b'{"round": 3}'}


def test_a_restore_leaves_a_result_the_store_holds_as_it_is(repo: Path):
    store = _write(repo / "store", STORE)
    assert _evidence(repo, "bundle", "first", str(store)).returncode == 0
    # here the same key was computed again (another machine's bits, other chunk files), and the
    # diverged run is being retried (its partial folder holds a checkpoint, no record)
    other = _write(
        repo / "other", {"train/r1.zarr/zarr.json": '{"other": 1}', "train/r1.zarr/x": "2"}
    )
    _write(other, {"train/r2.partial/checkpoint/zarr.json": "{}"})
    before = _files(other)
    done = _evidence(repo, "restore", str(other))
    assert "1 results restored into" in done.stdout and "2 already there" in done.stdout
    after = _files(other)
    assert {k: after[k] for k in before} == before
    assert set(after) - set(before) == {"partition/p1.zarr/zarr.json"}
    assert not [p for p in other.iterdir() if p.name.startswith(".restore")]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bundle", "first", "{store}"], "exists; choose another NAME"),
        (["bundle", "a b", "{store}"], "bundle NAME"),
        (["bundle", ".hidden", "{store}"], "bundle NAME"),
        (["bundle", "next", "{store}/missing"], "no such store"),
        (["bundle", "next", "s3://bucket/prefix"], "a folder store only"),
        (["restore", "s3://bucket/prefix"], "a folder store only"),
        (["pack"], "usage:"),
    ],
)
def test_bad_input_is_refused_in_one_line(repo: Path, args: list[str], message: str):
    store = _write(repo / "store", STORE)
    assert _evidence(repo, "bundle", "first", str(store)).returncode == 0
    refused = _evidence(repo, *(arg.format(store=store) for arg in args))
    assert refused.returncode == 2
    assert message in refused.stderr and len(refused.stderr.splitlines()) == 1


def test_an_unreadable_bundle_stops_a_bundle_and_a_restore(repo: Path):
    store = _write(repo / "store", STORE)
    (repo / "evidence").mkdir()
    (repo / "evidence" / "broken.tar.xz").write_bytes(b"not xz")
    for args in (["bundle", "next", str(store)], ["restore", str(repo / "restored")]):
        refused = _evidence(repo, *args)
        assert refused.returncode != 0 and "broken.tar.xz: not a readable bundle" in refused.stderr
    assert not (repo / "evidence" / "next.tar.xz").exists()


def test_every_committed_bundle_is_described():
    readme = (REPO / "evidence" / "README.md").read_text()
    for bundle in sorted((REPO / "evidence").glob("*.tar.xz")):
        assert f"`{bundle.name}`" in readme, f"evidence/README.md does not describe {bundle.name}"
