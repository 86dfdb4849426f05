"""The live view of a sweep: one table of runs (state, worker, round, accuracy, ETA) that
redraws in place on a terminal, or one line per node event (running, done, reused, failed)
when not on a terminal."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from fedhet.core import units
from fedhet.core.errors import DivergedError
from fedhet.core.pipeline import PROGRESS
from fedhet.core.store import ArtifactStore
from fedhet.execution import scheduler
from fedhet.execution.planning import Run
from fedhet.execution.results import stored_metrics
from fedhet.execution.scheduler import NodeState

DONE = {scheduler.COMPUTED: "done", scheduler.REUSED: "reused"}


@dataclass
class Rounds:
    """How far a running node is, and since when it counts (its attempt's start)."""

    done: int
    total: int
    accuracy: float
    attempt: int
    since_round: int  # rounds done when this attempt started, as far as known
    since: float
    latest: float  # when `done` was reported

    def eta_s(self, now: float) -> float:
        per_round = (self.latest - self.since) / max(1, self.done - self.since_round)
        return max(0.0, per_round * (self.total - self.done) - (now - self.latest))


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes}:{seconds:02d}"


def _percent(accuracy: float) -> str:
    return f"{units.percent(accuracy):.2f}"


def _reason(error: BaseException) -> str:
    """Why a node failed, in short: the command's last line gives the error itself, once."""
    if isinstance(error, DivergedError):
        return f"diverged in round {error.round_number}"
    return type(error).__name__


class SweepView(AbstractContextManager):
    def __init__(self, runs: list[Run], store: ArtifactStore, console: Console, live: bool):
        self.runs, self.store, self.console = runs, store, console
        self.states: dict[str, NodeState] = {}
        self._accuracies: dict[str, str] = {}  # a finished run's, read once
        self._rounds: dict[str, Rounds] = {}  # a running node's, as its worker reports them
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

    def on_progress(self, key: str, done: int, total: int, accuracy: float) -> None:
        """A node's worker finished round `done` of `total` (called from any thread)."""
        now, node, known = time.monotonic(), self.states.get(key), self._rounds.get(key)
        attempt = node.attempts if node is not None else 0
        if known is None or known.attempt != attempt:  # the attempt's first report
            started = node.started if node is not None else now
            known = Rounds(done, total, accuracy, attempt, done - 1, started, now)
        known.done, known.accuracy, known.latest = done, accuracy, now
        self._rounds[key] = known

    def _log(self, node: NodeState) -> None:
        task = node.task
        name = task.labels.get(task.key) or task.key[:12]
        error = f": {_reason(node.error)}" if node.error is not None else ""
        retry = f" (attempt {node.attempts + 1})" if node.state == scheduler.QUEUED else ""
        self.console.print(
            f"{task.node.stage} {task.key[:12]} {name}: {node.state}{retry}{error}",
            markup=False,
            soft_wrap=True,
        )

    def _row(self, run: Run) -> tuple[str, str, str, str]:
        """The run's state and, while it runs, where, how far, its accuracy and ETA."""
        mine = [self.states.get(node.key) for node in run.node.walk()]
        final = mine[-1]
        if final is not None and final.state in DONE:
            state = DONE[final.state]
            return state, "", self._accuracy(run, state), ""
        for node in mine:
            if node is not None and node.state in (scheduler.FAILED, scheduler.BLOCKED):
                return node.state, "", "", ""
        for node in mine:
            if node is not None and node.state in (scheduler.RUNNING, scheduler.HELD):
                return self._running(node)
        return "queued", "", "", ""

    def _running(self, node: NodeState) -> tuple[str, str, str, str]:
        stage, key = node.task.node.stage, node.task.key
        owner = self.store.holder(stage, key)
        where = f" on {owner.describe()}" if owner is not None else ""
        state = f"{'held elsewhere' if node.state == scheduler.HELD else 'running'} {stage}{where}"
        rounds = self._rounds.get(key)
        if node.state == scheduler.RUNNING and rounds is not None:
            eta = _duration(rounds.eta_s(time.monotonic()))
            accuracy = "" if rounds.accuracy != rounds.accuracy else _percent(rounds.accuracy)
            return state, f"round {rounds.done} of {rounds.total}", accuracy, eta
        probe = PROGRESS.get(stage)  # no reports (yet, or from Ray): what the checkpoints say
        partial = self.store.partial_dir(stage, key)
        progress = probe(node.task.node, partial) if probe and partial.exists() else None
        return state, progress or "", "", ""

    def _accuracy(self, run: Run, state: str) -> str:
        if state not in DONE.values():
            return ""
        if run.node.key not in self._accuracies:
            group = self.store.open(run.node.stage, run.node.key)
            acc = stored_metrics(group).get("test_accuracy")
            self._accuracies[run.node.key] = _percent(acc[-1]) if acc else ""
        return self._accuracies[run.node.key]

    def table(self) -> Table:
        table = Table(title=f"sweep: {time.monotonic() - self.started:.0f} s")
        for column in ("run", "state", "progress", "accuracy %", "ETA"):
            table.add_column(column)
        for run in self.runs:
            table.add_row(run.label, *self._row(run))
        return table
