"""The progress bar of a long stage: what runs, a bar, units done of the total, a note (e.g.
the latest accuracy), elapsed time and the estimated time remaining."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def stage_progress(console: Console, enabled: bool, unit: str) -> Progress:
    """A transient bar counting `unit`s; add tasks with a `note` field."""
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
