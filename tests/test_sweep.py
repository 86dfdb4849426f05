"""Sweeps: every stage node of every run scheduled over the DAG, on local worker processes
(`--jobs`) or Ray; results equal a sequential run bit for bit; locks on a shared store."""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import REPO, TINY_SPEC, cli_env, run_fedhet, write_spec

from fedhet.cli.app import ray_address_form
from fedhet.cli.sweep_view import Rounds, SweepView
from fedhet.core.spec import load_spec
from fedhet.core.store import ArtifactStore
from fedhet.execution.local_processes import LocalProcesses
from fedhet.execution.planning import runs_of
from fedhet.execution.results import stored_metrics
from fedhet.execution.sweep import compute_task, sweep
from fedhet.process import lockfile
from fedhet.process.interrupts import Interrupted

MATRIX = {
    **TINY_SPEC,
    "federation": {"rounds": 3, "batch_size": 32, "lr": 0.05},
    "runtime": {"threads": 1, "progress": False},  # a fast run: no checkpoint unless asked
    "matrix": {"algorithm.name": ["fedavg", "scaffold"], "seed": [0, 1]},
}


def stored(root: Path) -> dict[str, dict[str, np.ndarray]]:
    """stage/key -> every array of the artifact."""
    found = {}
    for info in ArtifactStore(root).ls():
        group = zarr.open_group(info.path, mode="r")
        found[f"{info.stage}/{info.key}"] = {
            name: array[...]
            for name, array in group.members(max_depth=None)
            if isinstance(array, zarr.Array) and "wall_time" not in name  # a timing
        }
    return found


def without_times(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "wall_time_s"} for row in rows]


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].keys() == b[key].keys(), key
        for name in a[key]:
            np.testing.assert_array_equal(a[key][name], b[key][name], err_msg=f"{key} {name}")


@pytest.fixture(scope="module")
def sequential(tmp_path_factory, fedhet):
    work = tmp_path_factory.mktemp("sequential")
    spec = write_spec(work / "matrix.yaml", MATRIX)
    result = fedhet("train", spec, "--format", "json", store=work / "store")
    assert result.rc == 0, result.stderr
    return spec, stored(work / "store"), without_times(json.loads(result.stdout))


def test_jobs_2_equals_sequential_bit_for_bit(sequential, fedhet, tmp_path):
    spec, expected, rows = sequential
    assert len(expected) == 2 + 4  # two partitions (one per seed) shared by two algorithms
    result = fedhet("train", spec, "--jobs", "2", "--format", "json", store=tmp_path / "s")
    assert result.rc == 0, result.stderr
    assert without_times(json.loads(result.stdout)) == rows
    assert_same(stored(tmp_path / "s"), expected)
    assert result.stderr.count("partition") == 2 * 2  # running, computed: each once


def test_a_killed_sweep_resumes_to_the_uninterrupted_result(sequential, fedhet, tmp_path):
    spec, expected, _ = sequential
    store = tmp_path / "s"
    # a lock of a dead process of this host is stale at once; the short timeout is for others
    env = cli_env(store, **{lockfile.STALE_ENV: "2"})
    every_round = ["runtime.checkpoint_every=1"]  # a runtime setting: the same keys
    first = subprocess.Popen(
        [sys.executable, "-m", "fedhet", "train", spec, *every_round, "--jobs", "2"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the command and its workers
    )
    deadline = time.monotonic() + 300  # generous: a loaded machine starts workers slowly
    while not list(store.glob("train/*.partial/ckpt-*")):  # a run has checkpointed a round
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.02)
    os.killpg(first.pid, signal.SIGKILL)  # the command and its workers, all at once
    first.wait(timeout=30)
    assert list(store.glob("train/*.lock"))  # left behind by the dead workers
    rerun = fedhet("train", spec, *every_round, env=env)  # in order: its messages say what it does
    assert rerun.rc == 0, rerun.stderr
    assert "taking over the stale lock of" in rerun.stderr
    assert re.search(r"resuming train \w+ from round [23] of 3", rerun.stderr), rerun.stderr
    assert_same(stored(store), expected)
    assert not list(store.glob("*/*.lock"))


def test_local_workers_report_each_round_to_the_view(tmp_path):
    spec = write_spec(tmp_path / "one.yaml", {**MATRIX, "matrix": {"seed": [0]}})
    runs, store = runs_of(load_spec(spec)), ArtifactStore(tmp_path / "s")
    view = SweepView(runs, store, console=None, live=False)
    reports = []

    def on_progress(*report):
        reports.append(report)
        view.on_progress(*report)

    states = sweep(runs, store, LocalProcesses(compute_task, 1, 1, on_progress), lambda n: None)
    (run,) = runs
    assert states[run.node.key].state == "computed"
    accuracy = stored_metrics(store.open("train", run.node.key))["test_accuracy"]
    assert reports == [(run.node.key, k + 1, 3, accuracy[k]) for k in range(3)]
    assert view._rounds[run.node.key].done == 3


def test_the_eta_is_the_time_per_round_times_the_rounds_left():
    rounds = Rounds(done=3, total=10, accuracy=0.5, attempt=1, since_round=1, since=0.0, latest=4.0)
    assert rounds.eta_s(now=4.0) == 2.0 * 7
    assert rounds.eta_s(now=5.0) == 2.0 * 7 - 1.0
    assert rounds.eta_s(now=100.0) == 0.0


def test_an_interrupt_keeps_where_it_stopped_across_processes():
    stop = Interrupted(signal.SIGTERM)
    stop.where = "at round 3 of 20"
    stop.in_stage("train 1a2b3c4d5e6f")
    again = pickle.loads(pickle.dumps(stop))
    assert str(again) == str(stop) and "at round 3 of 20 (train 1a2b3c4d5e6f)" in str(again)
    assert again.exit_code == 128 + signal.SIGTERM


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--jobs", "0"], "--jobs 0"),
        (["--ray-address", "127.0.0.1:9"], "--ray-address 127.0.0.1:9"),
        (["--ray", "127.0.0.1:9"], "--ray-address 127.0.0.1:9"),  # the address after --ray
        (["--jobs", "2", "--store", "/proc/fedhet-store"], "not writable"),
    ],
)
def test_bad_sweep_input_exits_2_in_one_line(fedhet, tmp_path, args, message):
    spec = write_spec(tmp_path / "m.yaml", MATRIX)
    result = fedhet("train", spec, *args, store=tmp_path / "s")
    assert result.rc == 2, result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()


# --- the lock file ------------------------------------------------------------------------


def test_a_live_lock_is_not_taken_and_a_released_one_is(tmp_path):
    path = tmp_path / "k.lock"
    with lockfile.try_acquire(path) as lease:
        assert lockfile.holder(path) == lease.owner
        assert lockfile.try_acquire(path) is None
    assert not path.exists() and lockfile.holder(path) is None


def dead_pid() -> int:
    """The process id of a process of this host that has ended."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(done.stdout)


def test_a_dead_owners_lock_is_taken_over_once(tmp_path):
    path = tmp_path / "k.lock"
    owner = lockfile.Owner(lockfile.socket.gethostname(), dead_pid(), time.time(), "dead")
    path.write_text(json.dumps(owner.__dict__))
    lease = lockfile.try_acquire(path)
    assert lease is not None and lease.took_over == owner
    assert lockfile.try_acquire(path) is None  # the new owner holds it
    lease.release()


def test_a_rerun_removes_the_lock_a_writer_killed_after_publishing_left(fedhet, tmp_path):
    """Killed between publishing an artifact and unlocking it, a writer leaves a lock on a
    stored key; the next command that finds the key stored removes it (a live one's stays)."""
    spec = write_spec(tmp_path / "one.yaml", {**MATRIX, "matrix": {"seed": [0, 1]}})
    store = tmp_path / "s"
    assert fedhet("train", spec, store=store).rc == 0
    dead = lockfile.Owner(lockfile.socket.gethostname(), dead_pid(), time.time(), "dead")
    (seed0, seed1) = sorted(store.glob("partition/*.zarr"))
    dead_lock, live_lock = (seed0.with_suffix(".lock"), seed1.with_suffix(".lock"))
    dead_lock.write_text(json.dumps(dead.__dict__))
    with lockfile.try_acquire(live_lock):
        rerun = fedhet("train", spec, store=store)
        assert rerun.rc == 0, rerun.stderr
        assert not dead_lock.exists() and live_lock.exists()


def test_a_dead_writers_lock_in_a_store_it_cannot_write_stays(tmp_path, monkeypatch):
    """A reader of a store it may not write reuses its artifacts; the lock stays for its owner."""
    key = "a" * 64
    lock = tmp_path / "train" / f"{key}.lock"
    lock.parent.mkdir()
    lock.write_text("{}")

    def refused(path: Path) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(lockfile, "try_acquire", refused)
    ArtifactStore(tmp_path).drop_stale_lock("train", key)
    assert lock.exists()


def test_a_silent_remote_owners_lock_goes_stale(tmp_path, monkeypatch):
    monkeypatch.setenv(lockfile.STALE_ENV, "0.5")
    path = tmp_path / "k.lock"
    remote = lockfile.Owner("another-machine", 1, time.time(), "remote")
    path.write_text(json.dumps(remote.__dict__))
    assert lockfile.try_acquire(path) is None  # its heartbeat is fresh
    time.sleep(0.6)
    with lockfile.try_acquire(path) as lease:
        assert lease.took_over == remote
        time.sleep(0.6)  # our own heartbeat keeps it live
        assert lockfile.holder(path) == lease.owner


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["train", "s.yaml", "--ray"], ["train", "s.yaml", "--ray"]),
        (
            ["train", "s.yaml", "--ray", "head:6379"],
            ["train", "s.yaml", "--ray-address", "head:6379"],
        ),
        (
            ["train", "--ray", "ray://10.0.0.1:10001", "s.yaml"],
            ["train", "--ray-address", "ray://10.0.0.1:10001", "s.yaml"],
        ),
        (["train", "s.yaml", "--ray", "auto"], ["train", "s.yaml", "--ray-address", "auto"]),
        (["train", "--ray", "s.yaml", "seed=1"], ["train", "--ray", "s.yaml", "seed=1"]),
        (
            ["train", "s.yaml", "--ray", "runtime.resources.cpus=2"],
            ["train", "s.yaml", "--ray", "runtime.resources.cpus=2"],
        ),
    ],
)
def test_an_address_after_ray_is_the_ray_address(args, expected):
    assert ray_address_form(args) == expected


def test_ray_flag_alone_starts_its_own_ray_and_equals_sequential(sequential, tmp_path):
    """`--ray` alone starts a Ray here, as the docs say: it never attaches to the cluster that
    Ray's record of the last local cluster names (left behind by a killed process, it made
    `train --ray` wait forever for a head that is gone). A new interpreter, so that such a wait
    ends with the timeout's kill; one Ray start checks both (each costs ~10 s)."""
    pytest.importorskip("ray")
    spec, expected, rows = sequential
    ray_tmp = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))  # short: Ray's socket paths
    (ray_tmp / "ray_current_cluster").write_text("192.0.2.2:46029\n")  # a head that is gone
    env = cli_env(tmp_path / "s", RAY_TMPDIR=str(ray_tmp))
    result = run_fedhet("train", spec, "--ray", "--format", "json", env=env, timeout=150)
    assert result.rc == 0, result.stderr
    assert without_times(json.loads(result.stdout)) == rows
    assert_same(stored(tmp_path / "s"), expected)


# --- a Ray cluster: the last tests, so that its processes do not run beside the others --------


@pytest.fixture(scope="module")
def ray_cluster():
    """The address of a local Ray cluster of two one-CPU nodes (real raylets), for this module."""
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    cluster = cluster_utils.Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()


def test_ray_two_node_cluster_equals_sequential(sequential, ray_cluster, fedhet, tmp_path):
    spec, expected, rows = sequential
    result = fedhet(
        "train", spec, "--ray-address", ray_cluster, "--format", "json", store=tmp_path / "s"
    )
    assert result.rc == 0, result.stderr
    assert without_times(json.loads(result.stdout)) == rows
    assert_same(stored(tmp_path / "s"), expected)


def test_resources_the_cluster_cannot_satisfy_exit_2_in_one_line(ray_cluster, fedhet, tmp_path):
    spec = write_spec(tmp_path / "m.yaml", MATRIX)
    result = fedhet(
        "train",
        spec,
        "runtime.resources.cpus=64",
        "--ray-address",
        ray_cluster,
        store=tmp_path / "s",
    )
    assert result.rc == 2, result.stderr
    assert "runtime.resources" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()  # nothing started
