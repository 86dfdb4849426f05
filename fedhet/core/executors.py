"""Where the scheduler's nodes are computed: in this process, or in N local worker processes."""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from fedhet.core import interrupts
from fedhet.core.scheduler import Task

Work = Callable[[Task], str]  # computes one node (module-level, so workers can import it)


class InProcess:
    """One node at a time, in this process (what `fedhet train` does without --jobs/--ray)."""

    capacity = 1

    def __init__(self, work: Work):
        self.work = work

    def submit(self, task: Task) -> Future[str]:
        future: Future[str] = Future()
        try:
            future.set_result(self.work(task))
        except Exception as error:  # a node's failure; Interrupted goes on up
            future.set_exception(error)
        return future

    def lost(self, error: BaseException) -> bool:
        return False

    def close(self, cancel: bool) -> None:
        pass


def _worker_init(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    # a stop (Ctrl-C reaches the whole process group; SIGTERM from `close`) saves the
    # checkpoint and ends the node with Interrupted, as in the main process
    signal.signal(signal.SIGINT, interrupts.handle)
    signal.signal(signal.SIGTERM, interrupts.handle)


class LocalProcesses:
    """`jobs` worker processes on this machine, started fresh (forkserver: no state inherited
    from this process but the imports); a pool whose worker died is replaced."""

    def __init__(self, work: Work, jobs: int, threads: int):
        self.work, self.capacity, self.threads = work, jobs, threads
        self._pool = self._start()

    def _start(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            self.capacity,
            mp_context=multiprocessing.get_context("forkserver"),
            initializer=_worker_init,
            initargs=(self.threads,),
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
        if cancel:  # ask running workers to save their checkpoints and stop
            for process in list(getattr(self._pool, "_processes", {}).values()):
                if process.is_alive():
                    process.terminate()
        self._pool.shutdown(wait=True, cancel_futures=cancel)
