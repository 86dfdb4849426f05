"""The live view of a sweep: one table of runs (state, worker, progress, accuracy, time) that
redraws in place on a terminal, or one line per event when not on a terminal."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from fedhet.core import scheduler
from fedhet.core.pipeline import PROGRESS
from fedhet.core.scheduler import NodeState
from fedhet.core.store import ArtifactStore
from fedhet.runs import Run, stored_metrics

DONE = {scheduler.COMPUTED: "done", scheduler.REUSED: "reused"}


class SweepView(AbstractContextManager):
    def __init__(self, runs: list[Run], store: ArtifactStore, console: Console, live: bool):
        self.runs, self.store, self.console = runs, store, console
        self.states: dict[str, NodeState] = {}
        self._accuracies: dict[str, str] = {}  # a finished run's, read once
        self.started = time.monotonic()
        self._live = Live(get_renderable=self.table, console=console, refresh_per_second=2)
        self.live = live

    def __enter__(self) -> SweepView:
        if self.live:
            self._live.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live:
            self._live.stop()

    def on_change(self, node: NodeState) -> None:
        self.states[node.task.key] = node
        if not self.live:
            self._log(node)

    def _log(self, node: NodeState) -> None:
        task = node.task
        name = task.labels.get(task.key) or task.key[:12]
        error = f": {node.error}" if node.error is not None else ""
        retry = f" (attempt {node.attempts + 1})" if node.state == scheduler.QUEUED else ""
        self.console.print(
            f"{task.node.stage} {task.key[:12]} {name}: {node.state}{retry}{error}",
            markup=False,
            soft_wrap=True,
        )

    def _run_state(self, run: Run) -> tuple[str, str]:
        """The run's state and, while it runs, where and how far."""
        mine = [self.states.get(node.key) for node in run.node.walk()]
        final = mine[-1]
        if final is not None and final.state in DONE:
            return DONE[final.state], ""
        for node in mine:
            if node is not None and node.state in (scheduler.FAILED, scheduler.BLOCKED):
                return node.state, ""
        for node in mine:
            if node is not None and node.state in (scheduler.RUNNING, scheduler.HELD):
                return self._running(node)
        return "queued", ""

    def _running(self, node: NodeState) -> tuple[str, str]:
        stage, key = node.task.node.stage, node.task.key
        owner = self.store.holder(stage, key)
        where = f" on {owner.describe()}" if owner is not None else ""
        probe = PROGRESS.get(stage)
        partial = self.store.partial_dir(stage, key)
        progress = probe(node.task.node, partial) if probe and partial.exists() else None
        state = "held elsewhere" if node.state == scheduler.HELD else "running"
        return f"{state} {stage}{where}", progress or ""

    def _accuracy(self, run: Run, state: str) -> str:
        if state not in DONE.values():
            return ""
        if run.node.key not in self._accuracies:
            group = self.store.open(run.node.stage, run.node.key)
            acc = stored_metrics(group).get("test_accuracy")
            self._accuracies[run.node.key] = f"{acc[-1]:.4f}" if acc else ""
        return self._accuracies[run.node.key]

    def table(self) -> Table:
        table = Table(title=f"sweep: {time.monotonic() - self.started:.0f} s")
        for column in ("run", "state", "progress", "accuracy"):
            table.add_column(column)
        for run in self.runs:
            state, progress = self._run_state(run)
            table.add_row(run.label, state, progress, self._accuracy(run, state))
        return table
