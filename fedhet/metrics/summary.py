"""Derived metrics of a run: best and final accuracy, rounds to a target accuracy."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def rounds_to_reach(accuracies: Sequence[float], target: float) -> int | None:
    """First (1-based) round whose test accuracy is >= target; None when never reached."""
    for rnd, acc in enumerate(accuracies, start=1):
        if not math.isnan(acc) and acc >= target:
            return rnd
    return None


def summarize(metrics: Mapping[str, Sequence[float]], target: float | None = None) -> dict:
    acc = [a for a in metrics["test_accuracy"]]
    evaluated = [(i + 1, a) for i, a in enumerate(acc) if not math.isnan(a)]
    best_round, best = max(evaluated, key=lambda ra: ra[1]) if evaluated else (None, math.nan)
    out = {
        "rounds": len(acc),
        "best_accuracy": best,
        "best_round": best_round,
        "final_accuracy": evaluated[-1][1] if evaluated else math.nan,
        "bytes_up": float(sum(metrics["bytes_up"])),
        "bytes_down": float(sum(metrics["bytes_down"])),
        "wall_time_s": float(sum(metrics["wall_time"])),
    }
    if target is not None:
        reached = rounds_to_reach(acc, target)
        out["target_accuracy"] = target
        out["rounds_to_target"] = reached if reached is not None else "never"
    return out
