"""How many threads a run computes on when its spec does not say (`runtime.threads`).

torch's own default is every core of the machine. On a machine where other processes keep
cores busy that is the worst choice: its OpenMP threads wait for cores that are not free, and a
60-round run measured 2.4-11x slower than on one thread. So the default is the cores this
process may use (its affinity, a cgroup quota) that are free now, split between the `--jobs`
workers. OpenMP keeps its own waiting policy: passive waiting (`OMP_WAIT_POLICY=PASSIVE`) made
two threads 2.9x slower than one on an idle machine (benchmarks/threads_under_load.py, FedAvg
MLP: 100.3 s against 34.5 s), far worse than the spinning it avoids once busy cores are left out.

Free cores are measured, not guessed from the load average (a minute-long average that misses
a competitor started seconds ago): the busy time of the usable cores over an interval, less this
process's own. The command line takes the first reading as it starts (`start_measuring`), so by
the time a run asks for its threads, torch's import has filled the interval and no wait is left.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SAMPLE_S = 0.2  # long enough for a scheduler tick on every core, short beside any run
_PROC_STAT = Path("/proc/stat")
_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")

log = logging.getLogger("fedhet")


def usable_cores() -> list[int]:
    """The cores this process may run on (its affinity mask; every core where none is kept)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def quota_cores() -> float | None:
    """A cgroup v2 CPU quota in cores (a container limited to 1.5 CPUs: 1.5); None if none."""
    try:
        quota, period = _CGROUP_CPU_MAX.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _cpu_times() -> dict[int, tuple[int, int]]:
    """core -> (idle, total) jiffies since boot, from /proc/stat."""
    times = {}
    for line in _PROC_STAT.read_text().splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        values = [int(v) for v in fields[:8]]
        idle = values[3] + values[4]  # idle + iowait
        times[int(name[3:])] = (idle, sum(values))
    return times


def _own_ticks() -> float:
    """This process's CPU time so far (all its threads), in /proc/stat's units."""
    times = os.times()
    return (times.user + times.system) * _TICKS_PER_SECOND


@dataclass(frozen=True)
class _Reading:
    at: float  # time.monotonic()
    cores: dict[int, tuple[int, int]]  # _cpu_times()
    own: float  # _own_ticks()


def _read() -> _Reading:
    return _Reading(time.monotonic(), _cpu_times(), _own_ticks())


_first: list[_Reading] = []  # the reading taken as the command started, if any


def start_measuring() -> None:
    """Take the free-core measurement's first reading now (a command's start)."""
    try:
        _first[:] = [_read()]
    except (OSError, ValueError):
        _first.clear()


def busy_cores(cores: list[int], interval: float = SAMPLE_S) -> int:
    """How many of `cores` other processes keep busy (0 where /proc/stat is unreadable): the
    cores' busy time since the first reading (or over `interval` from now, when there is none
    that long ago), less this process's own, in cores rounded; one competitor the scheduler
    moves between two cores (each half busy) counts as the one core it takes."""
    try:
        early = _first and time.monotonic() - _first[0].at >= interval
        before = _first[0] if early else _read()
        if not early:
            time.sleep(interval)
        after = _read()
    except (OSError, ValueError):
        return 0
    seen = [c for c in cores if c in before.cores and c in after.cores]
    totals = [after.cores[c][1] - before.cores[c][1] for c in seen]
    idles = [after.cores[c][0] - before.cores[c][0] for c in seen]
    if not seen or sum(totals) <= 0:
        return 0
    per_core = sum(totals) / len(seen)
    others = sum(totals) - sum(idles) - (after.own - before.own)
    return max(0, round(others / per_core))


@cache
def free_cores() -> int:
    """The usable cores that are free now (at least 1), measured once per process; warns when
    none is (every usable core is busy: the run still computes, on one thread)."""
    cores = usable_cores()
    limit = len(cores)
    quota = quota_cores()
    if quota is not None:
        limit = max(1, min(limit, int(quota)))
    free = limit - busy_cores(cores)
    if free < 1:
        log.warning(
            f"all {limit} usable cores are busy with other work: computing on 1 thread "
            "(set runtime.threads to choose)"
        )
    return max(1, min(free, limit))


_pinned: list[int] = []  # a worker process's thread count, chosen by the process that started it


def pin(threads: int) -> None:
    """Make `threads` this process's default (a `--jobs` worker: its parent counted the free
    cores for all its workers; the worker's own count would see its siblings as busy)."""
    _pinned[:] = [threads]


def default_threads(jobs: int = 1) -> int:
    """Threads for each of `jobs` worker processes when the spec sets none."""
    if _pinned:
        return _pinned[0]
    return max(1, free_cores() // max(1, jobs))
