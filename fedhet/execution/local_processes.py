"""Where the scheduler's nodes are computed: N local worker processes (Ray: ray_tasks)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.queues import Queue

from fedhet.core import plugin_isolation
from fedhet.core.pipeline import ProgressSink
from fedhet.execution.tasks import Task
from fedhet.process import cores, interrupts, lockfile

Work = Callable[[Task], str]  # computes one node (module-level, so workers can import it)

_progress: ProgressSink | None = None  # where a node computed in this process reports progress


def progress_sink() -> ProgressSink | None:
    """Where the node this process computes reports its progress (the sweep's view); None when
    no one listens."""
    return _progress


PARENT_POLL_S = 1.0


def _die_with(parent: int) -> None:
    """End this worker as if killed once `parent` (the `fedhet train` process) is gone, also
    after kill -9: its lock then goes stale at once (its pid is gone) and the node resumes from
    its last checkpoint when the sweep runs again. (Our own parent is the forkserver, which
    outlives `parent`, so the parent-death signal of Linux would not fire.)"""

    def watch() -> None:
        while lockfile.process_alive(parent):
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="fedhet-parent-watch").start()


def _forward(events: Queue) -> ProgressSink:
    return lambda *event: events.put(event)


def _worker_init(threads: int, parent: int, events: Queue | None) -> None:
    global _progress
    import torch

    _die_with(parent)
    plugin_isolation.warned_by_parent()  # one warning per broken plug-in, not one per worker
    cores.pin(threads)  # the parent split the free cores between its workers
    torch.set_num_threads(threads)
    # a stop (Ctrl-C reaches the whole process group; SIGTERM from `close`) saves the
    # checkpoint and ends the node with Interrupted, as in the main process
    signal.signal(signal.SIGINT, interrupts.handle)
    signal.signal(signal.SIGTERM, interrupts.handle)
    _progress = _forward(events) if events is not None else None


class LocalProcesses:
    """`jobs` worker processes on this machine, started fresh (forkserver: no state inherited
    from this process but the imports); a pool whose worker died is replaced. The workers'
    progress reaches `on_progress` here, through a queue read by a thread of this process."""

    def __init__(
        self, work: Work, jobs: int, threads: int, on_progress: ProgressSink | None = None
    ):
        self.work, self.capacity, self.threads = work, jobs, threads
        self._context = multiprocessing.get_context("forkserver")
        self._events = self._context.Queue() if on_progress is not None else None
        self._reader = None
        if on_progress is not None:
            self._reader = threading.Thread(
                target=self._read_events, args=(on_progress,), daemon=True, name="fedhet-progress"
            )
            self._reader.start()
        self._pool: ProcessPoolExecutor | None = self._start()

    def _read_events(self, on_progress: ProgressSink) -> None:
        for event in iter(self._events.get, None):
            on_progress(*event)

    def _start(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            self.capacity,
            mp_context=self._context,
            initializer=_worker_init,
            initargs=(self.threads, os.getpid(), self._events),
        )

    def submit(self, task: Task) -> Future[str]:
        try:
            return self._pool.submit(self.work, task)
        except BrokenProcessPool:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = self._start()
            return self._pool.submit(self.work, task)

    def lost(self, error: BaseException) -> bool:
        return isinstance(error, BrokenProcessPool)

    def close(self, cancel: bool) -> None:
        """Stop the workers (once; a second call does nothing)."""
        if self._pool is None:
            return
        if cancel:  # ask running workers to save their checkpoints and stop
            for process in list((self._pool._processes or {}).values()):
                if process.is_alive():
                    process.terminate()
        self._pool.shutdown(wait=True, cancel_futures=cancel)
        self._pool = None
        if self._reader is not None:
            self._events.put(None)
            self._reader.join()
