"""Paired comparison of an algorithm with a reference over seeds: runs are paired by seed, and
the per-seed differences give a mean, a Student t confidence interval and a verdict.

A run's value is a number, or a string saying why it has none (it diverged, it never reached
the target); a seed whose value is missing on either side is left out of the pairs and counted
by whose value is missing and why ("reference diverged", "both never reached")."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

TOO_FEW_SEEDS = "too few seeds"  # the verdict under 2 pairs: no interval, nothing to mark
CONFIDENCE = 0.95
UNMATCHED = "unmatched"  # a seed that only one of the two has

Value = float | str  # a string: the reason a run has no value


@dataclass(frozen=True)
class Pairing:
    seeds: tuple[int, ...]
    differences: tuple[float, ...]  # algorithm - reference (reference - algorithm: lower wins)
    left_out: dict[str, int]  # whose value is missing and why -> number of seeds left out


@dataclass(frozen=True)
class Comparison:
    n: int
    mean: float  # NaN for no pairs
    low: float | None  # the interval; None for fewer than 2 pairs
    high: float | None
    ahead: int  # pairs whose difference is > 0
    verdict: str  # ahead | behind | negligible | within noise | too few seeds


def pair(
    algorithm: Mapping[int, Value], reference: Mapping[int, Value], higher_is_better: bool = True
) -> Pairing:
    """Per-seed differences, oriented so that > 0 favours the algorithm, over the seeds where
    both runs have a value."""
    seeds, differences, left_out = [], [], Counter()
    for seed in sorted(algorithm.keys() | reference.keys()):
        if seed not in algorithm or seed not in reference:
            left_out[UNMATCHED] += 1
            continue
        ours, theirs = algorithm[seed], reference[seed]
        if isinstance(ours, str) or isinstance(theirs, str):
            left_out[_missing(ours, theirs)] += 1
            continue
        seeds.append(seed)
        differences.append(ours - theirs if higher_is_better else theirs - ours)
    return Pairing(tuple(seeds), tuple(differences), dict(left_out))


def _missing(algorithm: Value, reference: Value) -> str:
    """Whose value is missing and why: both (when for the same reason), else the algorithm's
    reason first."""
    if algorithm == reference:
        return f"both {algorithm}"
    if isinstance(algorithm, str):
        return f"algorithm {algorithm}"
    return f"reference {reference}"


def compare(
    differences: Sequence[float], confidence: float = CONFIDENCE, floor: float = 0.0
) -> Comparison:
    """Mean difference and its two-sided Student t interval (df = n - 1, standard deviation
    with ddof=1). The verdict: ahead / behind when the interval lies above / below 0 and the
    mean difference is at least `floor` in size (the smallest difference that matters),
    negligible when the interval excludes 0 but the mean is smaller, else within noise."""
    d = np.asarray(differences, dtype=float)
    n, ahead = d.size, int((d > 0).sum())
    mean = float(d.mean()) if n else math.nan
    if n < 2:
        return Comparison(n, mean, None, None, ahead, TOO_FEW_SEEDS)
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * float(d.std(ddof=1)) / math.sqrt(n)
    low, high = mean - half, mean + half
    if low <= 0 <= high:
        verdict = "within noise"
    elif abs(mean) < floor:
        verdict = "negligible"
    else:
        verdict = "ahead" if low > 0 else "behind"
    return Comparison(n, mean, low, high, ahead, verdict)
