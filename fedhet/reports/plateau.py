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
    """The rounds (1-based) of the quarter before the last, and of the last quarter."""
    half, three_quarters = rounds // 2, (3 * rounds) // 4
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
        return "not evaluated"
    if abs(mean_rise) < RISE_POINTS:
        return "levelled off"
    return "still rising" if mean_rise > 0 else "falling"


def plateau_section(cells: Mapping[tuple[str, str], list[dict]], reference: str) -> str:
    """A table of every group's rise, the reference's groups first."""
    ordered = sorted(cells.items(), key=lambda item: item[0][0] != reference)
    lines = [
        "| algorithm | setting | rounds compared | runs | mean rise (points) "
        f"| {100 * CONFIDENCE:.0f}% CI | per run | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (algorithm, setting), group in ordered:
        finished = [r for r in group if r["diverged"] is None]
        rises = [rise(r["metrics"]["test_accuracy"]) for r in finished]
        rises = [value for value in rises if not math.isnan(value)]
        comparison = compare(rises)
        interval = (
            "-"
            if comparison.low is None
            else (f"[{100 * comparison.low:+.2f}, {100 * comparison.high:+.2f}]")
        )
        spread = f"{100 * min(rises):+.2f} to {100 * max(rises):+.2f}" if rises else "-"
        before, last = quarters(max(len(r["metrics"]["test_accuracy"]) for r in group))
        windows = f"{before.start}-{before.stop - 1} vs {last.start}-{last.stop - 1}"
        mean = "-" if not rises else f"{100 * comparison.mean:+.2f}"
        lines.append(
            f"| {algorithm} | {setting} | {windows} | {len(rises)} | {mean} | {interval} "
            f"| {spread} | {verdict(comparison.mean)} |"
        )
    return (
        f"## Has {reference} levelled off?\n\nEach run's mean test accuracy over the evaluations "
        "in the last quarter of its rounds minus its mean over the quarter before (rounds "
        "compared); the mean of these rises over the runs (diverged runs left out), its "
        f"{100 * CONFIDENCE:.0f}% Student t interval, and the verdict: levelled off when the "
        f"mean rise is within {100 * RISE_POINTS:g} point, else still rising or falling.\n\n"
        + "\n".join(lines)
    )
