"""The train artifact's format: clients' states as stacked tables, checkpoints whose client
deltas hold only the clients touched since the previous save, atomic against a crash at any
step, layouts written before these still read, and no torch needed to count rounds."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import zarr

from fedhet.engine import run_format, tensors
from fedhet.engine.run_format import (
    Checkpoints,
    RunState,
    read_client_states,
    write_client_states,
    write_metrics,
)

GLOBAL = {"w": torch.zeros(3, 2), "b": torch.zeros(2)}


def control(seed: int) -> dict[str, torch.Tensor]:
    """A SCAFFOLD-like client state: one entry per model tensor, an integer counter too."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(3, 2, generator=gen),
        "b": torch.randn(2, generator=gen),
        "steps": torch.tensor(seed),
    }


def run_state(round: int, client_states: dict) -> RunState:
    metrics = {name: [float(r) for r in range(round)] for name in run_format.METRICS}
    return RunState(round, GLOBAL, {"c": torch.ones(2)}, client_states, metrics)


def assert_clients_equal(read: dict, written: dict) -> None:
    assert sorted(read) == sorted(written)
    for cid, state in written.items():
        assert list(read[cid]) == sorted(state), cid  # names in order, as tensors.load gives
        for name, value in state.items():
            assert read[cid][name].dtype == value.dtype
            assert torch.equal(read[cid][name], value), (cid, name)


def groups_under(path) -> int:
    return sum(
        1
        for p in path.rglob("zarr.json")
        if '"node_type":"group"' in p.read_text().replace(" ", "")
    )


def test_a_table_round_trips_mixed_and_empty_states(tmp_path):
    states = {7: control(7), 2: {}, 5: {"b": torch.full((2,), 5.0)}}
    group = zarr.open_group(tmp_path / "t.zarr", mode="w")
    write_client_states(group, states)
    table = group["clients"]
    assert table["ids"][:].tolist() == [2, 5, 7]
    assert table["holders/b"][:].tolist() == [5, 7] and table["values/b"].shape == (2, 2)
    assert table["holders/w"][:].tolist() == [7]
    assert_clients_equal(read_client_states(group), states)


def test_empty_states_write_no_group_per_client(tmp_path):
    folder = tmp_path / "partial"
    checkpoints = Checkpoints(folder)
    states = {cid: {} for cid in range(50)}  # FedAvg: every sampled client, nothing kept
    checkpoints.save(run_state(1, states))
    (delta,) = folder.glob("clients-*.zarr")
    assert groups_under(delta) == 2  # the delta and its table: no per-client group, no values
    assert_clients_equal(Checkpoints(folder).latest().client_states, states)


def test_a_save_writes_only_the_clients_touched_since_the_last(tmp_path):
    folder = tmp_path / "partial"
    checkpoints = Checkpoints(folder)
    states = {cid: control(cid) for cid in range(20)}
    checkpoints.save(run_state(1, states))
    states = dict(states) | {3: control(103), 11: control(111), 25: control(125)}
    checkpoints.save(run_state(2, states))
    deltas = sorted(folder.glob("clients-*.zarr"), key=lambda p: p.name)
    assert [p.name[:14] for p in deltas] == ["clients-000001", "clients-000002"]
    newest = zarr.open_group(deltas[-1], mode="r")
    assert newest["clients/ids"][:].tolist() == [3, 11, 25]
    assert [p.name for p in folder.glob("ckpt-*")] == ["ckpt-000002.zarr"]
    resumed = Checkpoints(folder).latest()
    assert resumed.round == 2 and resumed.metrics == run_state(2, {}).metrics
    assert_clients_equal(resumed.client_states, states)


def test_a_chain_is_compacted_and_every_save_reads_back_exactly(tmp_path):
    folder = tmp_path / "partial"
    checkpoints, rng = Checkpoints(folder), np.random.default_rng(0)
    states = {cid: control(cid) for cid in range(10)}
    for rnd in range(1, 16):
        touched = rng.choice(12, size=4, replace=False).tolist()  # new clients appear too
        states = dict(states) | {c: control(1000 * rnd + c) for c in touched}
        checkpoints.save(run_state(rnd, states))
        resumed = Checkpoints(folder)
        assert_clients_equal(resumed.latest().client_states, states)
        rows = sum(
            zarr.open_group(p, mode="r")["clients/ids"].shape[0]
            for p in folder.glob("clients-*.zarr")
        )
        assert rows <= 2 * len(states)  # superseded rows never outgrow one full table
    assert len(list(folder.glob("clients-*.zarr"))) < 15  # a full table restarted the chain


def test_a_resumed_checkpoints_object_goes_on_with_the_chain(tmp_path):
    folder = tmp_path / "partial"
    states = {cid: control(cid) for cid in range(8)}
    Checkpoints(folder).save(run_state(1, states))
    resumed = Checkpoints(folder)
    state = resumed.latest()
    state.client_states[4] = control(44)
    state.round = 2
    resumed.save(state)
    newest = max(folder.glob("clients-*.zarr"), key=lambda p: p.name)
    assert zarr.open_group(newest, mode="r")["clients/ids"][:].tolist() == [4]
    assert_clients_equal(Checkpoints(folder).latest().client_states, states | {4: control(44)})


@pytest.mark.parametrize("crash_in", ["write_client_states", "write_run_state"])
def test_a_crash_mid_save_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch, crash_in):
    folder = tmp_path / "partial"
    checkpoints = Checkpoints(folder)
    states = {cid: control(cid) for cid in range(6)}
    checkpoints.save(run_state(1, states))
    changed = states | {2: control(22)}

    def crash(*args, **kwargs):
        raise OSError("disk gone")

    with monkeypatch.context() as patch:
        patch.setattr(run_format, crash_in, crash)
        with pytest.raises(OSError):
            checkpoints.save(run_state(2, changed))
    resumed = Checkpoints(folder).latest()
    assert resumed.round == 1
    assert_clients_equal(resumed.client_states, states)
    Checkpoints(folder).save(run_state(2, changed))  # the next save clears what the crash left
    assert not list(folder.glob(".tmp-*"))
    assert_clients_equal(Checkpoints(folder).latest().client_states, changed)


def old_layout_checkpoint(folder, state: RunState) -> None:
    """A checkpoint as written before the client deltas: one group per client inside it."""
    group = zarr.open_group(folder / f"ckpt-{state.round:06d}.zarr", mode="w")
    group.attrs.update({"round": state.round, "best_accuracy": state.best_accuracy})
    write_metrics(group, state.metrics)
    tensors.save(group, "global", state.global_state)
    tensors.save(group, "server", state.server_state)
    clients = group.create_group("clients")
    for cid, cstate in state.client_states.items():
        tensors.save(clients, str(cid), cstate)


def test_a_checkpoint_of_the_old_layout_resumes_and_the_next_save_is_whole(tmp_path):
    folder = tmp_path / "partial"
    states = {0: control(0), 3: {}, 9: control(9)}
    old_layout_checkpoint(folder, run_state(2, states))
    checkpoints = Checkpoints(folder)
    resumed = checkpoints.latest()
    assert resumed.round == 2 and checkpoints.latest_round() == 2
    assert_clients_equal(resumed.client_states, states)
    resumed.round = 3
    checkpoints.save(resumed)  # nothing touched, yet the new chain must hold every client
    assert_clients_equal(Checkpoints(folder).latest().client_states, states)


def test_counting_rounds_and_reading_metrics_never_import_torch(tmp_path):
    folder = tmp_path / "partial"
    Checkpoints(folder).save(run_state(4, {1: control(1)}))
    code = (
        "import sys; from pathlib import Path; from fedhet.engine import run_format as f\n"
        f"folder = Path({str(folder)!r})\n"
        "assert f.Checkpoints(folder).latest_round() == 4\n"
        "group = f.zarr.open_group(next(folder.glob('ckpt-*')), mode='r')\n"
        "assert f.read_metrics(group)['test_accuracy'] == [0.0, 1.0, 2.0, 3.0]\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_save_after_another_writers_save_starts_a_whole_chain(tmp_path):
    folder = tmp_path / "partial"
    first, other = Checkpoints(folder), Checkpoints(folder)
    states = {cid: control(cid) for cid in range(5)}
    first.save(run_state(1, states))
    other.save(run_state(2, states | {1: control(11)}))  # removes the deltas `first` listed
    states = states | {3: control(33)}
    first.save(run_state(3, states))
    assert_clients_equal(Checkpoints(folder).latest().client_states, states)


def test_a_save_deletes_what_it_replaced_and_what_a_killed_run_left_being_deleted(tmp_path):
    folder = tmp_path / "partial"
    checkpoints = Checkpoints(folder)
    states = {cid: control(cid) for cid in range(4)}
    checkpoints.save(run_state(1, states))
    killed = folder / f"{run_format.TRASH}0badc0de-ckpt-000000.zarr" / "metrics"
    killed.mkdir(parents=True)  # a run killed while it deleted a replaced checkpoint
    states = states | {1: control(11)}
    checkpoints.save(run_state(2, states))
    # what the save replaced is out of the way at once, under a name nothing reads
    assert [p.name for p in folder.glob("ckpt-*")] == ["ckpt-000002.zarr"]
    checkpoints.wait_for_removals()
    listed = zarr.open_group(folder / "ckpt-000002.zarr", mode="r").attrs["client_deltas"]
    assert sorted(p.name for p in folder.iterdir()) == sorted(["ckpt-000002.zarr", *listed])
    assert_clients_equal(Checkpoints(folder).latest().client_states, states)


def files_of(folder) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def test_groups_written_together_are_the_same_files_as_written_one_by_one(tmp_path):
    """fedhet.core.sealed.create_groups (one trip into zarr's event loop) against a call per
    group and per array: nested names (their parent groups made by zarr), an empty group, an
    all-zero array (no chunk stored), integers and floats."""
    from fedhet.core.sealed import create_array, create_groups

    parts = {
        "clients": {
            "ids": np.arange(5),
            "values/w": np.random.default_rng(0).standard_normal((5, 3, 2)).astype(np.float32),
            "values/zero": np.zeros(4),
            "holders/w": np.arange(5),
        },
        "server": {},
        "metrics": {"test_accuracy": np.linspace(0.1, 0.9, 7)},
    }
    root = zarr.open_group(tmp_path / "one", mode="w")
    for path, arrays in parts.items():
        group = root.create_group(path)
        for name, data in arrays.items():
            create_array(group, name, data=data)
    create_groups(zarr.open_group(tmp_path / "together", mode="w"), parts)
    one_by_one = files_of(tmp_path / "one")
    assert files_of(tmp_path / "together") == one_by_one
    assert {"server/zarr.json", "clients/values/zero/zarr.json"} <= one_by_one.keys()


def test_a_failed_write_of_groups_returns_only_once_every_other_write_is_done(tmp_path):
    """A failure (here an array zarr cannot store, as a full disk would be) is raised only after
    the other writes finished: none goes on writing into the temporary folder its caller then
    deletes (fedhet.engine.run_format.Checkpoints._publish)."""
    from fedhet.core.sealed import create_groups

    many = {f"a{i}": np.full((64, 64), i + 1, dtype=np.float32) for i in range(40)}
    parts = {"ok": many, "bad": {"x": np.array([object()], dtype=object)}}
    with pytest.raises(ValueError):
        create_groups(zarr.open_group(tmp_path / "tmp", mode="w"), parts)
    written = {p.parts[-4] for p in (tmp_path / "tmp" / "ok").glob("*/c/0/0")}
    assert written == set(many)


def test_groups_written_together_finish_before_a_ctrl_c_is_raised(tmp_path):
    """SIGINT while the writes run on zarr's event loop (fedhet's handler installed, as the
    command line has it): `Interrupted` comes only once every array is written, so the caller's
    removal of its temporary folder is not raced by writes still going on."""
    import signal
    import threading

    from fedhet.core.sealed import create_groups
    from fedhet.process import interrupts

    many = {f"a{i}": np.full((64, 64), i + 1, dtype=np.float32) for i in range(300)}
    previous = signal.signal(signal.SIGINT, interrupts.handle)
    try:
        threading.Timer(0.05, signal.raise_signal, (signal.SIGINT,)).start()
        with pytest.raises(interrupts.Interrupted):
            create_groups(zarr.open_group(tmp_path / "tmp", mode="w"), {"ok": many})
            time.sleep(5)  # the signal arrives in here if the writes took under 0.05 s
    finally:
        signal.signal(signal.SIGINT, previous)
    written = {p.parts[-4] for p in (tmp_path / "tmp" / "ok").glob("*/c/0/0")}
    assert written == set(many)
