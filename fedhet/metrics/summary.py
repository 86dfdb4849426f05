"""Derived metrics of a run: best and final test accuracy (and, with a validation split, the test
accuracy at the best validation round), rounds to a target accuracy, and means of the test
accuracy over evaluated rounds (all of them, or the last tenth), optionally restricted to a set
of rounds (the rounds both sides of a paired comparison evaluated)."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence

import numpy as np

TAIL_DIVISOR = 10  # tail_mean averages the last 1/TAIL_DIVISOR of the evaluated rounds


def evaluated(accuracies: Sequence[float]) -> list[tuple[int, float]]:
    """(1-based round, test accuracy) of every round that was evaluated (its accuracy not NaN)."""
    return [(rnd, acc) for rnd, acc in enumerate(accuracies, start=1) if not math.isnan(acc)]


def rounds_to_reach(accuracies: Sequence[float], target: float) -> int | None:
    """First (1-based) round whose test accuracy is >= target; None when never reached."""
    return next((rnd for rnd, acc in evaluated(accuracies) if acc >= target), None)


def common_rounds(*curves: Sequence[float]) -> frozenset[int]:
    """The (1-based) rounds that no curve skipped: a round a curve ran without evaluating is
    left out; the rounds after a curve's end (a run that diverged) are not skipped, it stopped."""
    rounds = range(1, max((len(curve) for curve in curves), default=0) + 1)
    skipped = {rnd for curve in curves for rnd, acc in enumerate(curve, 1) if math.isnan(acc)}
    return frozenset(rnd for rnd in rounds if rnd not in skipped)


def restricted(accuracies: Sequence[float], rounds: Collection[int]) -> list[float]:
    """The accuracies with every round outside `rounds` counted as not evaluated (NaN)."""
    return [acc if rnd in rounds else math.nan for rnd, acc in enumerate(accuracies, start=1)]


def last_evaluated(accuracies: Sequence[float]) -> float:
    """The test accuracy of the last evaluated round; NaN when none was."""
    scored = evaluated(accuracies)
    return scored[-1][1] if scored else math.nan


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
    """One name per quantity: `best_test` (the highest test accuracy, the papers' metric),
    `final` (the last evaluated round's), and with a validation split `test_at_best_val` (the
    test accuracy of the round of the highest validation accuracy, fedhet's model selection).
    The first of equal rounds counts."""
    acc = list(metrics["test_accuracy"])
    scored = evaluated(acc)
    best_round = _best_round(scored)
    out = {
        "rounds": len(acc),
        "best_test": acc[best_round - 1] if best_round is not None else math.nan,
        "best_test_round": best_round,
        "final": last_evaluated(acc),
        "bytes_up": float(sum(metrics["bytes_up"])),
        "bytes_down": float(sum(metrics["bytes_down"])),
        "wall_time_s": float(sum(metrics["wall_time"])),
    }
    if "val_accuracy" in metrics:
        validated = evaluated(metrics["val_accuracy"])
        val_round = _best_round(validated)
        out["test_at_best_val"] = acc[val_round - 1] if val_round is not None else math.nan
        out["best_val_round"] = val_round
        out["best_val"] = max(v for _, v in validated) if validated else math.nan
    if target is not None:
        reached = rounds_to_reach(acc, target)
        out["target_accuracy"] = target
        out["rounds_to_target"] = reached if reached is not None else "never"
    return out


def _best_round(scored: list[tuple[int, float]]) -> int | None:
    """The first round of the highest value; None when nothing was evaluated."""
    return max(scored, key=lambda ra: ra[1])[0] if scored else None


def validated(summaries: Iterable[Mapping]) -> bool:
    """Whether any of the summaries comes from a run with a validation split."""
    return any("test_at_best_val" in summary for summary in summaries)
