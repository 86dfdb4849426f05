"""The thread default: the free usable cores, split between workers (fedhet.process.cores)."""

from __future__ import annotations

import logging

import pytest

from fedhet.core import provenance
from fedhet.process import cores


def _times(busy: dict[int, float], ticks: int = 100):
    """A /proc/stat reader whose second reading shows each core busy for its fraction."""
    readings = [
        {core: (0, 0) for core in busy},
        {core: (round(ticks * (1 - b)), ticks) for core, b in busy.items()},
    ]
    return lambda: readings.pop(0)


@pytest.fixture
def machine(monkeypatch):
    """A machine with the given cores' busy fractions and cgroup quota."""

    def make(busy: dict[int, float], quota: float | None = None):
        cores.free_cores.cache_clear()
        monkeypatch.setattr(cores, "_pinned", [])
        monkeypatch.setattr(cores, "_first", [])
        monkeypatch.setattr(cores, "_own_ticks", lambda: 0.0)
        monkeypatch.setattr(cores, "usable_cores", lambda: sorted(busy))
        monkeypatch.setattr(cores, "quota_cores", lambda: quota)
        monkeypatch.setattr(cores, "_cpu_times", _times(busy))
        monkeypatch.setattr(cores.time, "sleep", lambda s: None)

    yield make
    cores.free_cores.cache_clear()


def test_a_busy_core_is_left_to_its_owner(machine):
    machine({0: 0.97, 1: 0.05})
    assert cores.default_threads() == 1


def test_a_competitor_moved_between_cores_counts_as_the_one_core_it_takes(machine):
    machine({0: 0.5, 1: 0.52})
    assert cores.default_threads() == 1
    machine({0: 0.3, 1: 0.1, 2: 0.05, 3: 0.0})  # background noise takes no core
    assert cores.default_threads() == 4


def test_this_process_own_work_since_the_first_reading_is_not_a_competitor(monkeypatch):
    """The command line reads at its start; a run asks after its imports kept one core busy:
    that core is this process's, not taken."""
    readings = iter([{0: (0, 0), 1: (0, 0)}, {0: (5, 100), 1: (95, 100)}])  # core 0 busy
    monkeypatch.setattr(cores, "_cpu_times", lambda: next(readings))
    own = iter([0.0, 95.0])  # ...by this process
    monkeypatch.setattr(cores, "_own_ticks", lambda: next(own))
    clock = iter([0.0, 1.5, 1.5])
    monkeypatch.setattr(cores.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(cores.time, "sleep", lambda s: pytest.fail("a first reading needs no wait"))
    monkeypatch.setattr(cores, "_first", [])
    cores.start_measuring()
    assert cores.busy_cores([0, 1]) == 0


def test_idle_cores_are_all_used_and_split_between_workers(machine):
    machine({0: 0.0, 1: 0.02, 2: 0.1, 3: 0.0})
    assert cores.default_threads() == 4
    assert cores.default_threads(jobs=2) == 2
    assert cores.default_threads(jobs=3) == 1
    assert cores.default_threads(jobs=8) == 1  # never below one thread


def test_only_the_usable_cores_count(machine):
    # an affinity mask of cores 2 and 3: a busy core 0 elsewhere is no one's business
    machine({2: 0.0, 3: 0.9})
    assert cores.busy_cores([2, 3]) == 1
    machine({2: 0.0, 3: 0.9})
    assert cores.default_threads() == 1


def test_a_cgroup_quota_caps_the_threads(machine):
    machine({0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}, quota=1.5)
    assert cores.default_threads() == 1


def test_quota_is_read_from_cgroup_v2(tmp_path, monkeypatch):
    cpu_max = tmp_path / "cpu.max"
    monkeypatch.setattr(cores, "_CGROUP_CPU_MAX", cpu_max)
    cpu_max.write_text("150000 100000\n")
    assert cores.quota_cores() == 1.5
    cpu_max.write_text("max 100000\n")
    assert cores.quota_cores() is None
    cpu_max.unlink()
    assert cores.quota_cores() is None


def test_every_core_busy_warns_and_computes_on_one_thread(machine, caplog):
    machine({0: 1.0, 1: 0.99})
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        assert cores.default_threads() == 1
    assert "all 2 usable cores are busy" in caplog.text


def test_a_worker_keeps_the_count_its_parent_chose(machine):
    machine({0: 0.0, 1: 0.0})
    cores.pin(1)
    assert cores.default_threads() == 1


def test_this_machines_reading_is_within_its_cores():
    cores.free_cores.cache_clear()
    assert 1 <= cores.default_threads() <= len(cores.usable_cores())


def test_no_thread_count_is_planned_without_runtime_threads():
    """A spec without runtime.threads plans no count, so reusing an artifact computed on any
    number of threads is not announced as another environment; one with a count is."""
    stored = provenance.environment(threads=3, device="cpu")
    assert "threads" not in provenance.planned_environment(None, "cpu")
    assert provenance.differences(stored, provenance.planned_environment(None, "cpu")) == []
    assert provenance.differences(stored, provenance.planned_environment(1, "cpu")) == [
        "3 threads (now 1 thread)"
    ]
