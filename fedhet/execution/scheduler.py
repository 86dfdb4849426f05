"""One scheduler over the stage DAG of every run of a spec.

Every node of every run, deduplicated by key (a partition or a bootstrap shared by many runs is
computed once), goes to the executor as soon as its upstream nodes are stored. A node that a
live owner elsewhere holds (another `fedhet train` on the same store, on this machine or
another) is skipped and revisited, never waited on while other work is ready. A worker that
died is retried (the node resumes from its checkpoint); a node that fails for a reason of its
own fails once, blocks only the nodes built on it, and the others go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Protocol

from fedhet.core.pipeline import BUSY, COMPUTED, REUSED
from fedhet.execution.tasks import Task
from fedhet.process.interrupts import Interrupted


class Executor(Protocol):
    capacity: int  # nodes in flight at once

    def submit(self, task: Task) -> Future[str]:
        """Compute the node somewhere; the future's result is what `pipeline.compute` did."""
        ...

    def lost(self, error: BaseException) -> bool:
        """Whether `error` means the worker died (the node is retried) rather than failed."""
        ...

    def close(self, cancel: bool) -> None: ...


# A node's states besides what `compute` did with it (COMPUTED, REUSED).
QUEUED, RUNNING, HELD = "queued", "running", "held elsewhere"
FAILED, BLOCKED = "failed", "blocked"
STORED = (COMPUTED, REUSED)


@dataclass
class NodeState:
    task: Task
    upstream: set[str]
    state: str = QUEUED
    attempts: int = 0
    error: BaseException | None = None
    revisit_at: float = 0.0
    started: float = field(default=0.0, repr=False)


Listener = Callable[[NodeState], None]


class Scheduler:
    def __init__(
        self,
        tasks: dict[str, Task],
        executor: Executor,
        on_change: Listener = lambda state: None,
        poll_s: float = 0.5,
        retries: int = 3,
    ):
        self.nodes = {
            key: NodeState(task, {up.key for up in task.node.upstream.values()})
            for key, task in tasks.items()
        }
        self.executor, self.on_change = executor, on_change
        self.poll_s, self.retries = poll_s, retries
        self._running: dict[Future[str], str] = {}

    def run(self) -> dict[str, NodeState]:
        """Run every node to a finished state; the states by key."""
        try:
            while self._step():
                pass
        except BaseException:  # a stop, or a bug: the workers stop too
            self.executor.close(cancel=True)
            raise
        self.executor.close(cancel=False)
        return self.nodes

    def _set(self, node: NodeState, state: str, error: BaseException | None = None) -> None:
        node.state, node.error = state, error
        self.on_change(node)

    def _step(self) -> bool:
        self._block_below_failures()
        self._submit_ready()
        if not self._running:
            held = [n.revisit_at for n in self.nodes.values() if n.state == HELD]
            if not held:
                return False
            time.sleep(max(0.0, min(held) - time.monotonic()))
            return True
        done, _ = wait(self._running, timeout=self.poll_s, return_when=FIRST_COMPLETED)
        for future in done:
            self._finish(self.nodes[self._running.pop(future)], future)
        return True

    def _block_below_failures(self) -> None:
        changed = True
        while changed:
            changed = False
            for node in self.nodes.values():
                if node.state in (QUEUED, HELD) and any(
                    self.nodes[up].state in (FAILED, BLOCKED) for up in node.upstream
                ):
                    self._set(node, BLOCKED)
                    changed = True

    def _submit_ready(self) -> None:
        now = time.monotonic()
        for node in self.nodes.values():
            if len(self._running) >= self.executor.capacity:
                return
            ready = node.state == QUEUED or (node.state == HELD and node.revisit_at <= now)
            if ready and all(self.nodes[up].state in STORED for up in node.upstream):
                node.attempts += 1
                node.started = time.monotonic()
                self._running[self.executor.submit(node.task)] = node.task.key
                self._set(node, RUNNING)

    def _finish(self, node: NodeState, future: Future[str]) -> None:
        try:
            outcome = future.result()
        except (Interrupted, KeyboardInterrupt):
            raise
        except BaseException as error:  # noqa: BLE001 (a node's failure is reported, not raised)
            if self.executor.lost(error) and node.attempts <= self.retries:
                self._set(node, QUEUED)
            else:
                self._set(node, FAILED, error)
            return
        if outcome == BUSY:
            node.attempts -= 1  # nothing was tried
            node.revisit_at = time.monotonic() + self.poll_s
            self._set(node, HELD)
        else:
            self._set(node, outcome)
