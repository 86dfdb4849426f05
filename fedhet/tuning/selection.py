"""The one place a tune reads results: a run's validation curve, the score a trial gets from it,
and the rules that choose among the scores (the best trial; the close trials a runoff settles on
more seeds, and its winner). Nothing here opens a test metric, so no selection can depend on the
test split."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from fedhet.core.store import ArtifactStore
from fedhet.execution.planning import Run
from fedhet.execution.results import stored_divergence

VALIDATION_CURVE = "val_accuracy"


def validation_curve(run: Run, store: ArtifactStore) -> list[float] | None:
    """The run's validation accuracy per round (NaN where not evaluated); None when it
    diverged (a trial that diverges scores nothing). The run is stored or diverged."""
    node = run.node
    if store.exists(node.stage, node.key):
        return store.open(node.stage, node.key)["metrics"][VALIDATION_CURVE][:].tolist()
    if stored_divergence(run, store) is not None:
        return None
    raise KeyError(f"{run.label} is not stored")


def run_score(curve: Sequence[float] | None, metric: str) -> float:
    """best_val: the highest validation accuracy; final_val: the last evaluated one. NaN for a
    diverged run, or one never evaluated."""
    measured = [value for value in curve or () if not math.isnan(value)]
    if not measured:
        return math.nan
    return max(measured) if metric == "best_val" else measured[-1]


def trial_score(scores: Sequence[float]) -> float:
    """The mean over the selection seeds; NaN when a seed's run scored nothing."""
    return math.nan if any(math.isnan(s) for s in scores) else sum(scores) / len(scores)


def best_trial(scores: Sequence[float]) -> int | None:
    """The index of the highest score, the first of equal ones; None when none scored."""
    scored = [(score, -i) for i, score in enumerate(scores) if not math.isnan(score)]
    return -max(scored)[1] if scored else None


def close_trials(
    scores: Sequence[float], best_seeds: Sequence[float], within: float, most: int
) -> list[int]:
    """The trials that go to a runoff, by index, best first (then by score, the first of equal
    ones first): those scoring within `within` of the best, or within the seed-to-seed standard
    deviation of the best trial's scores (`best_seeds`, one per selection seed) when larger, at
    most `most`. None when fewer than two are that close: the best is chosen as it is."""
    best = best_trial(scores)
    if best is None:
        return []
    noise = statistics.stdev(best_seeds) if len(best_seeds) > 1 else 0.0
    floor = scores[best] - max(within, noise)
    close = [i for i, score in enumerate(scores) if not math.isnan(score) and score >= floor]
    close = sorted(close, key=lambda i: (-scores[i], i))[:most]
    return close if len(close) > 1 else []


def runoff_winner(close: Sequence[int], means: Sequence[float]) -> int:
    """The close trial with the highest mean over every seed, the selection seeds' and the
    runoff's (`means`, in the order of `close`), the first of equal ones; the best of the search
    (the first) when none of them scored on every seed."""
    winner = best_trial(means)
    return close[0] if winner is None else close[winner]
