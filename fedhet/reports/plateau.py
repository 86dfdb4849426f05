"""Has a curve levelled off? The rule the long specs fix before their runs: a group's mean test
accuracy over the evaluations in the last quarter of the rounds, against its mean over the
quarter before, paired over seeds; levelled off when the mean rise is within RISE_POINTS."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from fedhet.metrics.paired import CONFIDENCE, compare
from fedhet.metrics.summary import evaluated

RISE_POINTS = 0.01  # a mean rise (a fraction of accuracy) under this in size: levelled off


def quarters(rounds: int) -> tuple[range, range]:
    """The rounds (1-based) of the quarter before the last, and of the last quarter. Two rounds
    have no whole quarter: their windows are round 1 and round 2. One round has nothing to
    compare with: the first window is empty."""
    half, three_quarters = rounds // 2, (3 * rounds) // 4
    if rounds == 2:
        half = 0
    return range(half + 1, three_quarters + 1), range(three_quarters + 1, rounds + 1)


def rise(accuracies: Sequence[float]) -> float:
    """Mean test accuracy over the last quarter's evaluations minus the quarter before's; NaN
    when either quarter has none."""
    before, last = quarters(len(accuracies))
    scored = evaluated(accuracies)
    means = [[acc for rnd, acc in scored if rnd in window] for window in (before, last)]
    if not all(means):
        return math.nan
    return float(np.mean(means[1]) - np.mean(means[0]))


def verdict(mean_rise: float) -> str:
    if math.isnan(mean_rise):
        return "no evaluation in a window"
    if abs(mean_rise) < RISE_POINTS:
        return "levelled off"
    return "still rising" if mean_rise > 0 else "falling"


def moving(verdict: str) -> bool:
    """Whether a curve's verdict says its budget stopped before the plateau: still rising or
    falling, or too few rounds to tell. A curve whose every run diverged, or without an
    evaluation in a window, is not judged either way."""
    return verdict in ("still rising", "falling") or verdict.startswith("too few rounds")


def early_pairs(
    cells: Mapping[tuple[str, str], list[dict]], reference: str
) -> set[tuple[str, str]]:
    """The (algorithm, setting) pairs whose verdict against `reference` reads as early
    training's, not the plateau's: either curve of the pair is still moving there (the
    difference of two curves settles only when both have levelled off)."""
    moving_curves = {key for key, group in cells.items() if moving(_group_cells(group)[-1])}
    return {
        (algorithm, setting)
        for algorithm, setting in cells
        if algorithm != reference and {(algorithm, setting), (reference, setting)} & moving_curves
    }


def plateau_section(cells: Mapping[tuple[str, str], list[dict]], reference: str) -> str:
    """A table of every group's rise, the reference's groups first."""
    ordered = sorted(cells.items(), key=lambda item: item[0][0] != reference)
    lines = [
        "| algorithm | setting | rounds compared | runs | mean rise (points) "
        f"| {100 * CONFIDENCE:.0f}% CI | per run (points) | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (algorithm, setting), group in ordered:
        lines.append(f"| {algorithm} | {setting} | " + " | ".join(_group_cells(group)) + " |")
    return (
        f"## Has each curve levelled off?\n\nFor every algorithm and setting ({reference} "
        "first): each run's mean test accuracy over the evaluations in the last quarter of its "
        "rounds minus its mean over the quarter before (rounds compared; a run of 2 rounds: round "
        "2 against round 1); the mean of these rises over the runs (diverged runs left out), its "
        f"{100 * CONFIDENCE:.0f}% Student t interval, and the verdict: levelled off when the "
        f"mean rise is within {100 * RISE_POINTS:g} point, else still rising or falling.\n\n"
        + "\n".join(lines)
    )


def _group_cells(group: list[dict]) -> list[str]:
    """The cells after a group's labels: rounds compared, runs, mean rise, interval, spread over
    runs and verdict."""
    before, last = quarters(max(len(r["metrics"]["test_accuracy"]) for r in group))
    if not before:
        return ["-", "-", "-", "-", "-", "too few rounds (1)"]
    finished = [r for r in group if r["diverged"] is None]
    if not finished:
        return [f"{_window(before)} vs {_window(last)}", "0", "-", "-", "-", "every run diverged"]
    rises = [rise(r["metrics"]["test_accuracy"]) for r in finished]
    rises = [value for value in rises if not math.isnan(value)]
    comparison = compare(rises)
    interval = (
        "-"
        if comparison.low is None
        else (f"[{100 * comparison.low:+.2f}, {100 * comparison.high:+.2f}]")
    )
    spread = f"{100 * min(rises):+.2f} to {100 * max(rises):+.2f}" if rises else "-"
    mean = "-" if not rises else f"{100 * comparison.mean:+.2f}"
    return [
        f"{_window(before)} vs {_window(last)}",
        str(len(rises)),
        mean,
        interval,
        spread,
        verdict(comparison.mean),
    ]


def _window(rounds: range) -> str:
    """`3-5`, or `3` for a window of one round."""
    return f"{rounds.start}" if len(rounds) == 1 else f"{rounds.start}-{rounds.stop - 1}"
