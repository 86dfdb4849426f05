"""Derived metrics of a run: best and final accuracy, rounds to a target accuracy, and means of
the test accuracy over its evaluated rounds (all of them, or the last tenth).

The "best" round is the evaluated round of the highest test accuracy, or, in a run with a
validation split (its metrics hold `val_accuracy`), of the highest validation accuracy; the
first of equals either way. `best_accuracy` is the test accuracy of that round; with a validation
split the summary adds `selection: "validation"` and the round's `best_val_accuracy`."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

TAIL_DIVISOR = 10  # tail_mean averages the last 1/TAIL_DIVISOR of the evaluated rounds


def evaluated(accuracies: Sequence[float]) -> list[tuple[int, float]]:
    """(1-based round, test accuracy) of every round that was evaluated (its accuracy not NaN)."""
    return [(rnd, acc) for rnd, acc in enumerate(accuracies, start=1) if not math.isnan(acc)]


def rounds_to_reach(accuracies: Sequence[float], target: float) -> int | None:
    """First (1-based) round whose test accuracy is >= target; None when never reached."""
    return next((rnd for rnd, acc in evaluated(accuracies) if acc >= target), None)


def evaluated_mean(accuracies: Sequence[float]) -> float:
    """Mean test accuracy over the evaluated rounds (the area under the accuracy curve divided
    by its length); NaN when no round was evaluated."""
    values = [acc for _, acc in evaluated(accuracies)]
    return float(np.mean(values)) if values else math.nan


def tail_mean(accuracies: Sequence[float]) -> float:
    """Mean test accuracy over the last E // 10 of the E evaluated rounds, at least the last
    one; NaN when no round was evaluated."""
    values = [acc for _, acc in evaluated(accuracies)]
    if not values:
        return math.nan
    return float(np.mean(values[-max(1, len(values) // TAIL_DIVISOR) :]))


def summarize(metrics: Mapping[str, Sequence[float]], target: float | None = None) -> dict:
    acc = [a for a in metrics["test_accuracy"]]
    scored = evaluated(acc)
    validated = "val_accuracy" in metrics
    candidates = evaluated(metrics["val_accuracy"]) if validated else scored
    best_round = max(candidates, key=lambda ra: ra[1])[0] if candidates else None
    out = {
        "rounds": len(acc),
        "best_accuracy": acc[best_round - 1] if best_round is not None else math.nan,
        "best_round": best_round,
        "final_accuracy": scored[-1][1] if scored else math.nan,
        "bytes_up": float(sum(metrics["bytes_up"])),
        "bytes_down": float(sum(metrics["bytes_down"])),
        "wall_time_s": float(sum(metrics["wall_time"])),
    }
    if validated:
        out["selection"] = "validation"
        out["best_val_accuracy"] = max(c[1] for c in candidates) if candidates else math.nan
    if target is not None:
        reached = rounds_to_reach(acc, target)
        out["target_accuracy"] = target
        out["rounds_to_target"] = reached if reached is not None else "never"
    return out


def best_label(summaries: Iterable[Mapping]) -> str:
    """What the summaries' `best_accuracy` is, as a report's title (capitalized)."""
    selections = {summary.get("selection", "test") for summary in summaries}
    if selections == {"validation"}:
        return "Test accuracy at the best validation round"
    if "validation" in selections:
        return "Test accuracy at the best validation round (best test accuracy without a split)"
    return "Best test accuracy (the papers' metric)"
