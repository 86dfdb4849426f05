"""The artifact store: atomic publish, corruption detection, key lookup, per-key locking, gc."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import CliRunner

from fedhet.core.errors import InputError
from fedhet.core.sealed import create_array
from fedhet.core.store import TMP_MARK, ArtifactStore

KEY = "a1" * 32


def publish(store: ArtifactStore, stage: str, key: str, size: int = 50) -> None:
    """A small artifact with several chunks per array and a nested group, its arrays written
    as every stage writes them (each chunk with its crc32c)."""
    with store.lock(stage, key), store.write(stage, key, {"config": {"n": size}}) as group:
        create_array(group, "values", data=np.arange(size, dtype=np.float32), chunks=(16,))
        create_array(group, "matrix", data=np.arange(1, 37).reshape(6, 6), chunks=(4, 4))
        weights = np.linspace(-1, 1, 30).reshape(5, 6)
        create_array(group.create_group("model"), "weights", data=weights, chunks=(2, 6))


def start_python(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# --- publishing ---------------------------------------------------------------------------


def test_published_artifact_has_its_attributes_and_verifies(store: ArtifactStore):
    publish(store, "demo", KEY)
    assert store.exists("demo", KEY)
    attrs = store.info("demo", KEY).attrs
    assert attrs["config"] == {"n": 50} and attrs["stage"] == "demo" and attrs["key"] == KEY
    assert {"created", "wall_time_s", "fedhet_version", "command"} <= set(attrs)
    assert set(attrs["checksums"]) == {"values", "matrix", "model/weights"}
    assert store.verify("demo", KEY) == []
    group = store.open("demo", KEY)
    np.testing.assert_array_equal(group["model/weights"][:], np.linspace(-1, 1, 30).reshape(5, 6))
    assert [p.name for p in (store.root / "demo").iterdir() if TMP_MARK in p.name] == []


def test_a_failed_write_publishes_nothing_and_leaves_no_temporary(store: ArtifactStore):
    with pytest.raises(RuntimeError), store.write("demo", KEY, {}) as group:
        group.create_array("values", data=np.arange(10))
        raise RuntimeError("stage failed")
    assert not store.exists("demo", KEY)
    assert [p for p in (store.root / "demo").iterdir() if TMP_MARK in p.name] == []


WRITER = """
    import sys, time
    import numpy as np
    from fedhet.core.store import ArtifactStore

    store = ArtifactStore(sys.argv[1])
    with store.lock("demo", sys.argv[2]), store.write("demo", sys.argv[2], {}) as group:
        array = group.create_array("values", shape=(1000,), chunks=(100,), dtype="int64")
        array[:500] = np.arange(500)  # five chunk files written, five to go
        print("ready", flush=True)
        time.sleep(120)
"""


def test_killed_writer_leaves_no_published_entry_and_gc_cleans_up(store: ArtifactStore):
    writer = start_python(WRITER, str(store.root), KEY)
    try:
        assert writer.stdout.readline() == "ready\n", writer.stderr.read()
        (temporary,) = [p for p in (store.root / "demo").iterdir() if TMP_MARK in p.name]
        assert len(list((temporary / "values" / "c").iterdir())) == 5
        assert store.gc() == []  # a live writer holds its key's lock: its temporary stays
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
    finally:
        writer.kill()
    assert not store.exists("demo", KEY)
    assert store.ls() == []
    with pytest.raises(InputError):
        store.find(KEY[:6])
    assert sorted(Path(p).name for p in store.gc()) == sorted([temporary.name, f"{KEY}.lock"])
    assert list((store.root / "demo").iterdir()) == []


def test_gc_keeps_published_artifacts_and_removes_finished_checkpoints(store: ArtifactStore):
    store.partial_dir("demo", KEY).mkdir(parents=True)  # checkpoints of a run in progress
    assert store.gc() == []
    publish(store, "demo", KEY)  # publishing removes its own checkpoints
    assert not store.partial_dir("demo", KEY).exists()
    store.partial_dir("demo", KEY).mkdir()  # left by a crash after publishing
    removed = {Path(p).name for p in store.gc()}
    assert removed == {f"{KEY}.partial"}  # the lock file went when its writer released it
    assert store.exists("demo", KEY) and store.verify("demo", KEY) == []


# --- corruption ---------------------------------------------------------------------------


def chunk_files(store: ArtifactStore, stage: str, key: str) -> list[Path]:
    root = store.path(stage, key)
    return sorted(p for p in root.rglob("*") if p.is_file() and "/c/" in f"/{p.relative_to(root)}")


@pytest.mark.parametrize("decode", [True, False])  # `fedhet plan` checks the bytes only
def test_verify_detects_a_flipped_byte_in_any_chunk(store: ArtifactStore, decode: bool):
    publish(store, "demo", KEY)
    chunks = chunk_files(store, "demo", KEY)
    assert len(chunks) == 4 + 4 + 3  # values, matrix (2x2 chunks), model/weights
    rng = np.random.default_rng(0)
    for chunk in chunks:
        original = chunk.read_bytes()
        array = str(chunk.relative_to(store.path("demo", KEY))).split("/c/")[0]
        for position in {0, len(original) - 1, *rng.integers(0, len(original), 3).tolist()}:
            flipped = bytearray(original)
            flipped[position] ^= 0x01
            chunk.write_bytes(bytes(flipped))
            problems = store.verify("demo", KEY, decode)
            assert problems == [f"{array}: checksum mismatch"], (chunk, position)
        chunk.write_bytes(original)
    assert store.verify("demo", KEY) == []


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ("zarr.json", "zarr.json: unreadable metadata"),
        ("values/zarr.json", "values: metadata changed: checksum mismatch"),
    ],
)
def test_corrupt_metadata_is_listed_and_reported_not_raised(
    store: ArtifactStore, metadata: str, expected: str
):
    publish(store, "demo", KEY)
    target = store.path("demo", KEY) / metadata
    target.write_bytes(b"{\x00" + target.read_bytes()[2:])
    assert [a.key for a in store.ls()] == [KEY]
    assert store.verify("demo", KEY) == [expected]


def test_cli_verify_exits_1_on_corruption(fedhet: CliRunner, tmp_path: Path):
    store = ArtifactStore(tmp_path)
    publish(store, "demo", KEY)
    publish(store, "demo", "b2" * 32)
    assert fedhet("artifacts", "verify", store=tmp_path).rc == 0
    chunk = chunk_files(store, "demo", KEY)[-1]
    chunk.write_bytes(bytes([chunk.read_bytes()[0] ^ 0xFF]) + chunk.read_bytes()[1:])
    result = fedhet("artifacts", "verify", store=tmp_path)
    assert result.rc == 1
    assert f"demo/{KEY[:12]}: CORRUPT" in result.stdout
    assert f"demo/{'b2' * 6}: ok" in result.stdout
    assert result.stderr.strip() == "error: 1 corrupt artifact" and "Traceback" not in result.stderr
    assert fedhet("artifacts", "verify", "b2b2", store=tmp_path).rc == 0


# --- lookup -------------------------------------------------------------------------------


def test_find_by_prefix(store: ArtifactStore):
    keys = {"abc1" + "0" * 60, "abc2" + "0" * 60, "ffff" + "0" * 60}
    for key in keys:
        publish(store, "demo", key, size=3)
    publish(store, "other", "abc1" + "1" * 60, size=3)
    assert store.find("abc2").key == "abc2" + "0" * 60
    assert store.find("demo/abc1").key == "abc1" + "0" * 60
    assert store.find("ff").stage == "demo"
    with pytest.raises(InputError, match="ambiguous.*give more characters"):
        store.find("abc")
    with pytest.raises(InputError, match="ambiguous"):
        store.find("abc1")  # one in demo, one in other
    with pytest.raises(InputError, match="no artifact key starts with 'abd'"):
        store.find("abd")
    assert sorted((a.stage, a.key) for a in store.ls()) == sorted(
        [("demo", k) for k in keys] + [("other", "abc1" + "1" * 60)]
    )


# --- one computation per key --------------------------------------------------------------

COMPUTER = """
    import sys, time
    from types import SimpleNamespace
    import numpy as np
    from fedhet.core.pipeline import RunContext, StageNode, ensure, stage
    from fedhet.core.store import ArtifactStore

    @stage("slow_test_stage")
    def slow(node, ctx, out, partial):
        with open(sys.argv[2], "a") as log:
            log.write(f"computed once\\n")
        time.sleep(1.0)
        out.create_array("answer", data=np.array([42]))

    # all a stage-less run needs (a name, runtime settings, and a dump recorded as the spec as
    # run); keeps torch out
    spec = SimpleNamespace(
        name="lock-test",
        runtime=SimpleNamespace(threads=None),
        model_dump=lambda **_: {"name": "lock-test"},
    )
    print("ready", flush=True)
    sys.stdin.readline()  # start both processes' `ensure` together
    node = StageNode("slow_test_stage", 1, {"x": 1})
    group = ensure(node, RunContext(spec, ArtifactStore(sys.argv[1])))
    print(int(group["answer"][0]), flush=True)
"""


def test_two_processes_compute_one_artifact_once(tmp_path: Path):
    log = tmp_path / "computations.log"
    workers = [start_python(COMPUTER, str(tmp_path / "store"), str(log)) for _ in range(2)]
    try:
        for worker in workers:
            assert worker.stdout.readline() == "ready\n", worker.stderr.read()
        for worker in workers:
            worker.stdin.write("go\n")
            worker.stdin.flush()
        outputs = [worker.communicate(timeout=120) for worker in workers]
    finally:
        for worker in workers:
            worker.kill()
    assert [out for out, _ in outputs] == ["42\n", "42\n"], outputs
    assert log.read_text() == "computed once\n"
    messages = [err for _, err in outputs]
    assert sum("computing" in m for m in messages) == sum("reusing" in m for m in messages) == 1
