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

from fedhet.core.errors import Interrupted
from fedhet.core.pipeline import BUSY, COMPUTED, REUSED, StageNode
from fedhet.core.spec import Spec


@dataclass(frozen=True)
class Task:
    """What a worker needs to compute one node. It travels to other processes as the run's
    spec (JSON) and the node's key, and is planned again there."""

    node: StageNode
    spec: Spec  # the spec the node runs under
    run_spec: Spec  # the spec of the run that brought the node in
    store_root: str
    labels: dict[str, str]
    run_name: str | None  # the run whose final node this is; None for shared upstream nodes

    @property
    def key(self) -> str:
        return self.node.key

    def __reduce__(self):
        spec = self.run_spec.model_dump(mode="json", serialize_as_any=True)
        return _replanned, (spec, self.key, self.store_root, self.labels, self.run_name)


def final_task(run_spec: Spec, store_root: str, labels: dict[str, str], run_name: str) -> Task:
    node = run_spec.algorithm.plan(run_spec)
    return Task(node, run_spec, run_spec, store_root, labels, run_name)


def _replanned(
    spec: dict, key: str, store_root: str, labels: dict[str, str], run_name: str | None
) -> Task:
    final = final_task(Spec.model_validate(spec), store_root, labels, run_name or "")
    return _tasks_below(final)[key]


def _tasks_below(final: Task) -> dict[str, Task]:
    """The final task and every task below it, upstream first, each with its node's spec (its
    own where it has one, else the nearest one above)."""
    tasks: dict[str, Task] = {}

    def visit(node: StageNode, spec: Spec, run_name: str | None) -> None:
        spec = node.spec or spec
        for up in node.upstream.values():
            visit(up, spec, None)
        tasks.setdefault(
            node.key, Task(node, spec, final.run_spec, final.store_root, final.labels, run_name)
        )

    visit(final.node, final.spec, final.run_name)
    return tasks


def plan_tasks(finals: list[Task]) -> dict[str, Task]:
    """Every node below the runs' final nodes once (the first run that needs it brings it)."""
    tasks: dict[str, Task] = {}
    for final in finals:
        for key, task in _tasks_below(final).items():
            tasks.setdefault(key, task)
    return tasks


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
