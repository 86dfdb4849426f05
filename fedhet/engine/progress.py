"""The progress of a long stage: on a terminal a bar (what runs, units done of the total, a
note such as the latest accuracy, elapsed time and the estimated time remaining); elsewhere (a
log file, a pipe) one line every few units, about LINES lines for the whole stage."""

from __future__ import annotations

import math
import time
from contextlib import AbstractContextManager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from fedhet.core import units

LINES = 15  # what a stage prints at most (and about) when not on a terminal


def stage_progress(console: Console, enabled: bool, unit: str) -> Progress | ProgressLines:
    """A transient bar counting `unit`s on a terminal, else lines; add tasks with a `note`
    field. Neither shows anything unless `enabled`."""
    if not console.is_terminal:
        return ProgressLines(console, enabled, unit)
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn(f"{unit} {{task.completed}}/{{task.total}}"),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not enabled,
        transient=True,
    )


def round_note(accuracy: float, loss: float | None = None) -> str:
    """A round's note: `acc 81.25% loss 0.5321`, the accuracy (stored as a fraction) in percent
    as in every table, none for a round that was not evaluated (NaN)."""
    parts = [] if math.isnan(accuracy) else [f"acc {units.percent(accuracy):.2f}%"]
    if loss is not None:
        parts.append(f"loss {loss:.4f}")
    return " ".join(parts)


class ProgressLines(AbstractContextManager):
    """Progress as lines (`name: round 4/20 acc 81.25% loss 0.5321, 12s`): one each time a
    task's note comes with a multiple of its step (total / LINES, rounded up) or its last unit.
    The same calls as rich's Progress that stages use: add_task, update."""

    def __init__(self, console: Console, enabled: bool, unit: str):
        self.console, self.enabled, self.unit = console, enabled, unit
        self._tasks: list[tuple[str, int, float]] = []  # description, total, started
        self._done: list[int] = []  # units completed, per task

    def add_task(self, description: str, total: int, **fields: Any) -> int:
        self._tasks.append((description, total, time.monotonic()))
        self._done.append(0)
        return len(self._tasks) - 1

    def advance(self, task: int, amount: int) -> None:
        self.update(task, self._done[task] + amount, note="")

    def update(self, task: int, completed: int, note: str | None = None, **_: Any) -> None:
        """A line for a note past a step, none for a position alone (where a resumed run
        starts)."""
        description, total, started = self._tasks[task]
        step = max(1, math.ceil(total / LINES))
        crossed = completed // step > self._done[task] // step or completed == total
        self._done[task] = completed
        if not self.enabled or note is None or not crossed:
            return
        elapsed = round(time.monotonic() - started)
        self.console.print(
            f"{description}: {self.unit} {completed}/{total} {note}".rstrip() + f", {elapsed}s",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )

    def __exit__(self, *exc: object) -> None:
        return None
