"""The store on S3 across machines, against the loopback rclone server: credentials and endpoint
from an AWS profile as the AWS CLI reads them, `artifacts gc` on the server, and a train lost
with its machine resumed, then extended, by another machine bit for bit."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import TINY_SPEC, CliRunner, write_spec
from test_object_store import machine, new_url, one_line_error

from benchmarks.s3_server import BUCKET, KEY_ID, SECRET, S3Server
from fedhet.core import aws_profile, object_locks
from fedhet.core.errors import InputError
from fedhet.core.object_store import remote_for
from fedhet.core.store import ArtifactStore
from fedhet.process import lockfile

CREDENTIALS = f"""
[default]
aws_access_key_id = default-key-id-0000
aws_secret_access_key = default-secret
[lab]
aws_access_key_id = {KEY_ID}
aws_secret_access_key = {SECRET}
aws_session_token = lab-token
"""

CONFIG = """
[default]
region = eu-west-1
[profile lab]
region = us-east-1
endpoint_url = {endpoint}
[profile minio]
services = local-s3
aws_access_key_id = config-key-id-0000
aws_secret_access_key = config-secret
[services local-s3]
s3 =
  endpoint_url = http://127.0.0.1:7
[profile corp]
sso_session = corp
"""


def aws_home(home: Path, endpoint: str) -> Path:
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text(CREDENTIALS)
    (home / ".aws" / "config").write_text(CONFIG.format(endpoint=endpoint))
    return home


def test_a_profile_gives_what_the_environment_leaves_unset_as_the_aws_cli_reads_it(
    tmp_path: Path,
):
    home = str(aws_home(tmp_path, "http://127.0.0.1:9"))
    assert aws_profile.settings({"HOME": home}) == {
        "access_key_id": "default-key-id-0000",
        "secret_access_key": "default-secret",
        "region": "eu-west-1",
    }
    lab = {"HOME": home, "AWS_PROFILE": "lab"}
    assert aws_profile.settings(lab) == {
        "access_key_id": KEY_ID,
        "secret_access_key": SECRET,
        "session_token": "lab-token",
        "region": "us-east-1",
        "endpoint": "http://127.0.0.1:9",
    }
    environment = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "r"}
    assert aws_profile.settings(lab | environment | {"AWS_ENDPOINT_URL": "http://e"}) == {}
    assert aws_profile.settings(lab | {"AWS_DEFAULT_REGION": "r"})["endpoint"] == (
        "http://127.0.0.1:9"
    )
    assert aws_profile.settings({"HOME": home, "AWS_PROFILE": "minio"}) == {
        "access_key_id": "config-key-id-0000",  # from the config file, as the AWS CLI does
        "secret_access_key": "config-secret",
        "endpoint": "http://127.0.0.1:7",  # its services section's s3 endpoint
    }
    elsewhere = {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_CONFIG_FILE": "/no"}
    assert aws_profile.settings({"HOME": home} | elsewhere) == {}
    with pytest.raises(InputError, match=r"^AWS_PROFILE=nope: no such profile in "):
        aws_profile.settings({"HOME": home, "AWS_PROFILE": "nope"})
    with pytest.raises(InputError, match="sso_session, which fedhet does not read"):
        aws_profile.settings({"HOME": home, "AWS_PROFILE": "corp"})


def profile_machine(s3: S3Server, root: Path, url: str, profile: str) -> dict[str, str]:
    """A machine whose keys and endpoint come only from its AWS profile `profile`."""
    env = {k: v for k, v in machine(s3, root / "cache", url).items() if not k.startswith("AWS_")}
    return env | {"HOME": str(aws_home(root / "home", s3.endpoint)), "AWS_PROFILE": profile}


def test_a_store_reached_with_only_an_aws_profile(fedhet: CliRunner, s3: S3Server, tmp_path):
    spec, url = write_spec(tmp_path / "spec.yaml", TINY_SPEC), new_url()
    trained = fedhet("train", spec, env=profile_machine(s3, tmp_path / "a", url, "lab"))
    assert trained.rc == 0, trained.stderr
    runs = fedhet("runs", spec, env=machine(s3, tmp_path / "b", url))  # keys from the environment
    assert runs.rc == 0 and "stored" in runs.stdout, runs.stdout + runs.stderr
    wrong = fedhet("train", spec, env=profile_machine(s3, tmp_path / "c", url, "nope"))
    assert "AWS_PROFILE=nope: no such profile in" in one_line_error(wrong, 2)
    for result in (trained, runs, wrong):
        assert SECRET not in result.stdout + result.stderr


# --- gc on the server -------------------------------------------------------------------------


def server_files(s3: S3Server, url: str) -> dict[str, bytes]:
    folder = s3.root / BUCKET / url.rsplit("/", 1)[1]
    return {f.relative_to(folder).as_posix(): f.read_bytes() for f in folder.rglob("*")
            if f.is_file()}  # fmt: skip


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def test_gc_on_the_server_removes_what_dead_writers_left_and_never_a_committed_artifact(
    fedhet: CliRunner, s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import obstore

    spec, url = write_spec(tmp_path / "spec.yaml", TINY_SPEC), new_url()
    env = machine(s3, tmp_path / "cache", url)
    assert fedhet("train", spec, env=env).rc == 0
    committed = server_files(s3, url)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    remote = remote_for(url)
    assert remote is not None
    (train,) = [key for stage, key in remote.committed() if stage == "train"]
    dead = lockfile.Owner(socket.gethostname(), dead_pid(), time.time(), "dead")
    leftovers = {
        "train/half.zarr/zarr.json": b"{}",  # a writer that died before its marker
        f"train/{train}.zarr/stray": b"unreferenced",
        f"train/{train}.partial/ckpt-000001.zarr/zarr.json": b"{}",  # a finished run's
        f"train/{train}.partial/ckpt-000001.zarr.commit": b"{}",
        "train/dead.lock": object_locks._owner_bytes(dead),
        ".fedhet-probe-0123": b"1",
        "train/busy.zarr/zarr.json": b"{}",  # a live writer's, under its lock
    }
    for name, data in leftovers.items():
        obstore.put(remote.store, name, data)
    held = object_locks.try_lock(remote, "train", "busy")
    assert held is not None
    try:
        kept = fedhet("artifacts", "gc", env=env)  # within the grace: only the locks and areas
        assert kept.rc == 0, kept.stderr
        assert f"removed {url}/train/dead.lock" in kept.stdout
        assert f"removed {url}/train/{train}.partial/" in kept.stdout
        assert "half.zarr" not in kept.stdout and "stray" not in kept.stdout
        dry = fedhet("artifacts", "gc", "--grace", "0", "--dry-run", env=env)
        assert dry.rc == 0 and "3 entries would be removed" in dry.stdout, dry.stdout
        assert f"would remove {url}/.fedhet-probe-0123" in dry.stdout
        assert f"would remove {url}/train/half.zarr/" in dry.stdout
        assert f"would remove {url}/train/{train}.zarr/" in dry.stdout  # its stray object
        assert "train/half.zarr/zarr.json" in server_files(s3, url)
        swept = fedhet("artifacts", "gc", "--grace", "0", env=env)
        assert swept.rc == 0 and "3 entries removed" in swept.stdout, swept.stdout
    finally:
        held.release()
    left = server_files(s3, url)
    assert set(left) - set(committed) == {"train/busy.zarr/zarr.json"}
    assert {name: left[name] for name in committed} == committed  # the artifacts, bit for bit
    again = fedhet("train", spec, env=machine(s3, tmp_path / "elsewhere", url))
    assert again.rc == 0 and "computing" not in again.stderr, again.stderr
    assert fedhet("artifacts", "verify", env=env).rc == 0


# --- a train lost with its machine, resumed and extended by another ---------------------------

ROUNDS = 16
LONG = {
    **TINY_SPEC,
    "name": "long",
    "federation": {"rounds": ROUNDS, "batch_size": 16, "lr": 0.05},
    "runtime": {"threads": 1, "progress": False},  # a fast run: no checkpoint unless asked
}


def train_arrays(store: ArtifactStore) -> dict[str, np.ndarray]:
    """Every array of the store's train artifact, less the timings."""
    (info,) = [info for info in store.ls() if info.stage == "train"]
    group = zarr.open_group(info.path, mode="r")
    return {
        name: array[...]
        for name, array in group.members(max_depth=None)
        if isinstance(array, zarr.Array) and "time" not in name
    }


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_a_train_lost_with_its_machine_is_resumed_then_extended_by_another_bit_for_bit(
    fedhet: CliRunner, s3: S3Server, tmp_path: Path
):
    spec, url = write_spec(tmp_path / "long.yaml", LONG), new_url()
    area = s3.root / BUCKET / url.rsplit("/", 1)[1] / "train"
    stale = {lockfile.STALE_ENV: "1"}  # heartbeats, and checkpoints sent, every 1/6 s
    work = {name: tmp_path / name for name in ("a", "b", "c")}
    for folder in work.values():
        folder.mkdir()
    env_a = machine(s3, tmp_path / "cache-a", url) | stale
    machine_a = subprocess.Popen(
        [sys.executable, "-m", "fedhet", "train", spec, "runtime.checkpoint_every=1"],
        cwd=work["a"], env=env_a,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not list(area.glob("*.partial/ckpt-*.zarr.commit")):  # a checkpoint on the server
            assert machine_a.poll() is None, "machine A ended before sending a checkpoint"
            assert time.monotonic() < deadline, "no checkpoint reached the server"
            time.sleep(0.02)
        os.kill(machine_a.pid, signal.SIGKILL)  # the machine is lost: no clean-up at all
    finally:
        machine_a.kill()
        machine_a.wait(timeout=30)

    env_b = machine(s3, tmp_path / "cache-b", url) | stale
    resumed = fedhet("train", spec, env=env_b, cwd=work["b"])
    assert resumed.rc == 0, resumed.stderr
    assert "taking over the stale lock of" in resumed.stderr, resumed.stderr
    found = re.search(rf"resuming train \w+ from round (\d+) of {ROUNDS}", resumed.stderr)
    assert found and int(found.group(1)) >= 2, resumed.stderr
    assert not list(area.glob("*.partial/*")), "the finished run's checkpoints stay on the server"
    local = fedhet("train", spec, store=tmp_path / "local")
    assert local.rc == 0, local.stderr
    b_store = ArtifactStore(tmp_path / "cache-b" / "object-stores" / BUCKET / url.rsplit("/")[-1])
    assert_same(train_arrays(b_store), train_arrays(ArtifactStore(tmp_path / "local")))

    longer = f"federation.rounds={ROUNDS + 3}"
    env_c = machine(s3, tmp_path / "cache-c", url)
    extended = fedhet("train", spec, longer, env=env_c, cwd=work["c"])
    assert extended.rc == 0 and f"with {ROUNDS} rounds" in extended.stderr, extended.stderr
    scratch = fedhet("train", spec, longer, store=tmp_path / "scratch")
    assert scratch.rc == 0, scratch.stderr
    exported = [
        fedhet("export", spec, longer, env=env_c),
        fedhet("export", spec, longer, store=tmp_path / "scratch"),
    ]
    assert exported[0].rc == 0 and exported[1].rc == 0, exported[0].stderr + exported[1].stderr
    assert [_no_times(e.stdout) for e in exported][0] == _no_times(exported[1].stdout)
    for folder in work.values():  # no store in any machine's working folder
        assert list(folder.iterdir()) == []


def _no_times(table: str) -> list[list[str]]:
    rows = [line.split(",") for line in table.splitlines()]
    keep = [i for i, name in enumerate(rows[0]) if "time" not in name]
    return [[row[i] for i in keep] for row in rows]


def test_a_checkpoint_area_follows_its_lock_from_machine_to_machine(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    url, key = new_url(), "ab" * 32
    for name, value in machine(s3, tmp_path / "a", url).items():
        monkeypatch.setenv(name, value)
    a = ArtifactStore(url)
    with a.lock("train", key):  # machine A writes a checkpoint, one in progress, a record
        partial = a.partial_dir("train", key)
        (partial / "ckpt-000002.zarr" / "c").mkdir(parents=True)
        (partial / "ckpt-000002.zarr" / "zarr.json").write_bytes(b"{}")
        (partial / "ckpt-000002.zarr" / "c" / "0").write_bytes(b"round two")
        (partial / ".tmp-ckpt-000003.zarr").mkdir()
        (partial / "diverged.json").write_text("{}")
    area = s3.root / BUCKET / url.rsplit("/", 1)[1] / "train" / f"{key}.partial"
    assert sorted(p.name for p in area.iterdir()) == [
        "ckpt-000002.zarr", "ckpt-000002.zarr.commit", "diverged.json",
    ]  # fmt: skip

    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "b"))
    b = ArtifactStore(url)
    with b.lock("train", key):  # machine B finds it, bit for bit, and drops the record
        partial = b.partial_dir("train", key)
        assert written(partial) == ["ckpt-000002.zarr/c/0", "ckpt-000002.zarr/zarr.json",
                                    "diverged.json"]  # fmt: skip
        assert (partial / "ckpt-000002.zarr" / "c" / "0").read_bytes() == b"round two"
        (partial / "diverged.json").unlink()
    assert sorted(p.name for p in area.iterdir()) == ["ckpt-000002.zarr", "ckpt-000002.zarr.commit"]


def written(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
