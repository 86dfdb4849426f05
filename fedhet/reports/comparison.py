"""The report's paired comparisons: in every setting, each algorithm against the reference
algorithm, run by run over the seeds both have (fedhet.metrics.paired), for each metric below.

A metric of the curve (the mean over the rounds, the last tenth, the rounds to a target) is
taken, in each pair, over the rounds that both runs evaluated: a method that skips early
evaluations (TCT's stage 1) is compared with its reference over the same rounds, never over
more of the reference's. A diverged run keeps the values of the metrics it reached before
diverging (its best accuracy, the round it reached the target) and has none for the metrics of
the end of a run or of the whole run (final accuracy, the last tenth's mean, the mean over the
evaluated rounds).

Values are compared as stored (accuracies as fractions); a difference is shown in its metric's
unit (`in_unit`: percentage points for accuracies, rounds for rounds to a target)."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from fedhet.core import units
from fedhet.metrics.paired import (
    CONFIDENCE,
    TOO_FEW_SEEDS,
    Comparison,
    Pairing,
    Value,
    compare,
    pair,
)
from fedhet.metrics.summary import (
    common_rounds,
    evaluated_mean,
    last_evaluated,
    restricted,
    rounds_to_reach,
    tail_mean,
    validated,
)

DIVERGED = "diverged"
NEVER_REACHED = "never reached"
NOT_EVALUATED = "not evaluated"
NO_VALIDATION = "no validation split"
FLOOR_POINTS = 0.5  # the smallest difference in accuracy a verdict calls a gain, in points
FLOOR_ACCURACY = units.fraction(FLOOR_POINTS)  # the same between stored accuracies
FLOOR_ROUNDS = 1.0  # the same for rounds to a target

Rounds = Collection[int] | None  # the rounds a pair shares (None: the metric is not per round)


@dataclass(frozen=True)
class PairedMetric:
    title: str
    value: Callable[[dict, Rounds], Value]  # a report row and its pair's rounds -> its value
    unit: str = units.POINTS  # differences shown in percentage points, or in rounds
    higher_is_better: bool = True
    per_round: bool = False  # taken over the rounds both runs of a pair evaluated


def _measured(value: float) -> Value:
    return NOT_EVALUATED if math.isnan(value) else value


def _curve(row: dict, rounds: Rounds) -> list[float]:
    curve = row["metrics"]["test_accuracy"]
    return list(curve) if rounds is None else restricted(curve, rounds)


def _whole_run(accuracy: Callable[[list[float]], float]) -> Callable[[dict, Rounds], Value]:
    """A metric of the end of the run or of all of it: none for a diverged run."""

    def value(row: dict, rounds: Rounds) -> Value:
        if row["diverged"] is not None:
            return DIVERGED
        return _measured(accuracy(_curve(row, rounds)))

    return value


def _rounds_to(target: float) -> Callable[[dict, Rounds], Value]:
    def value(row: dict, rounds: Rounds) -> Value:
        reached = rounds_to_reach(_curve(row, rounds), target)
        if reached is not None:
            return float(reached)
        return DIVERGED if row["diverged"] is not None else NEVER_REACHED

    return value


def _test_at_best_val(row: dict, rounds: Rounds) -> Value:
    return _measured(row["test_at_best_val"]) if "test_at_best_val" in row else NO_VALIDATION


def paired_metrics(target: float | None, with_validation: bool = False) -> list[PairedMetric]:
    """The metrics compared; with a validation split, the test accuracy at the best validation
    round too."""
    metrics = [PairedMetric("Best test accuracy (the papers' metric)", _best_test)]
    if with_validation:
        metrics.append(
            PairedMetric("Test accuracy at the best validation round", _test_at_best_val)
        )
    metrics += [
        PairedMetric("Final test accuracy", _whole_run(last_evaluated)),
        PairedMetric(
            "Mean test accuracy over the last tenth of the rounds both evaluated",
            _whole_run(tail_mean),
            per_round=True,
        ),
        PairedMetric(
            "Mean test accuracy over the rounds both evaluated (area under the curve)",
            _whole_run(evaluated_mean),
            per_round=True,
        ),
    ]
    if target is not None:
        metrics.append(
            PairedMetric(
                f"Rounds to {100 * target:.2f}% test accuracy, over the rounds both evaluated "
                "(rounds saved: reference minus algorithm)",
                _rounds_to(target),
                unit="rounds",
                higher_is_better=False,
                per_round=True,
            )
        )
    return metrics


def _best_test(row: dict, rounds: Rounds) -> Value:
    return _measured(row["best_test"])


@dataclass(frozen=True)
class PairedRow:
    algorithm: str
    setting: str
    pairing: Pairing
    comparison: Comparison
    rounds: str = ""  # which rounds a per-round metric was taken over


EARLY = " (early training)"  # a verdict's mark where either curve compared still moves


def compared(
    cells: Mapping[tuple[str, str], list[dict]],
    reference: str,
    metric: PairedMetric,
    floor: float = FLOOR_ACCURACY,
) -> list[PairedRow]:
    """Every other algorithm against `reference` in each setting where the reference ran;
    `floor` is the smallest difference in accuracy (as stored: a fraction) a verdict calls a
    gain."""
    out = []
    for (algorithm, setting), group in cells.items():
        baseline = cells.get((reference, setting))
        if algorithm == reference or baseline is None:
            continue
        ours, theirs = _by_seed(group), _by_seed(baseline)
        shared = {seed: _shared_rounds(ours[seed], theirs[seed]) for seed in ours.keys() & theirs}
        pairing = pair(
            {seed: metric.value(row, shared.get(seed)) for seed, row in ours.items()},
            {seed: metric.value(row, shared.get(seed)) for seed, row in theirs.items()},
            metric.higher_is_better,
        )
        minimum = FLOOR_ROUNDS if metric.unit == "rounds" else floor
        rounds = describe_rounds(shared.values()) if metric.per_round else ""
        out.append(
            PairedRow(
                algorithm, setting, pairing, compare(pairing.differences, floor=minimum), rounds
            )
        )
    return out


def _by_seed(group: list[dict]) -> dict[int, dict]:
    return {row["seed"]: row for row in group}


def _shared_rounds(ours: dict, theirs: dict) -> frozenset[int]:
    return common_rounds(ours["metrics"]["test_accuracy"], theirs["metrics"]["test_accuracy"])


def describe_rounds(shared: Collection[frozenset[int]]) -> str:
    """The rounds the pairs share, e.g. `6-10 (5)` or `5-120 every 5 (24)`; per seed when the
    pairs differ (a diverged run ends early)."""
    texts = sorted({_span(rounds) for rounds in shared})
    return texts[0] if len(texts) == 1 else "per seed: " + "; ".join(texts)


def _span(rounds: frozenset[int]) -> str:
    ordered = sorted(rounds)
    if not ordered:
        return "none"
    steps = {b - a for a, b in zip(ordered, ordered[1:], strict=False)}
    first, last, n = ordered[0], ordered[-1], len(ordered)
    if n == 1:
        return f"{first} (1)"
    if steps == {1}:
        return f"{first}-{last} ({n})"
    if len(steps) == 1:
        return f"{first}-{last} every {steps.pop()} ({n})"
    return f"{n} rounds from {first} to {last}"


def in_unit(difference: float, unit: str) -> float:
    """A difference of stored values as shown: of accuracies in points, of rounds in rounds."""
    return units.percent(difference) if unit == units.POINTS else difference


def paired_table(rows: list[PairedRow], unit: str, early: Collection[tuple[str, str]] = ()) -> str:
    def signed(value: float) -> str:
        return f"{in_unit(value, unit):+.2f}" if unit == units.POINTS else f"{value:+.1f}"

    with_rounds = any(row.rounds for row in rows)
    lines = [
        f"| algorithm | setting | pairs | mean difference ({unit}) | {100 * CONFIDENCE:.0f}% CI "
        f"| seeds ahead | verdict | left out |{' rounds |' if with_rounds else ''}",
        "|---|---|---|---|---|---|---|---|" + ("---|" if with_rounds else ""),
    ]
    for row in rows:
        c = row.comparison
        mean = "-" if c.n == 0 else signed(c.mean)
        interval = "-" if c.low is None else f"[{signed(c.low)}, {signed(c.high)}]"
        lines.append(
            f"| {row.algorithm} | {row.setting} | {c.n} | {mean} | {interval} | {c.ahead}/{c.n} "
            f"| {c.verdict}{EARLY if marked(c, (row.algorithm, row.setting) in early) else ''} "
            f"| {_left_out(row.pairing.left_out)} |" + (f" {row.rounds} |" if with_rounds else "")
        )
    return "\n".join(lines)


def marked(comparison: Comparison, early: bool) -> bool:
    """Whether a verdict carries the early-training mark: a moving pair's, unless no interval
    was taken (too few seeds: there is no verdict for the budget to qualify)."""
    return early and comparison.verdict != TOO_FEW_SEEDS


def _left_out(reasons: dict[str, int]) -> str:
    return ", ".join(f"{n} {reason}" for reason, n in reasons.items()) or "-"


def paired_section(
    cells: Mapping[tuple[str, str], list[dict]],
    reference: str,
    target: float | None,
    floor: float = FLOOR_ACCURACY,
    early: Collection[tuple[str, str]] = (),
) -> str:
    """One paired table per metric, or a line saying there is nothing to compare; a verdict of
    an (algorithm, setting) pair in `early` (plateau.early_pairs) is marked early training."""
    points = units.percent(floor)
    intro = (
        f"## Paired differences against {reference}\n\nIn each setting, every other algorithm "
        f"minus {reference}, run by run over the seeds both have (pairs); mean difference, its "
        f"{100 * CONFIDENCE:.0f}% Student t interval over the pairs (df = pairs - 1), the pairs "
        "whose difference is > 0, and the verdict: ahead / behind (the interval above / below 0 "
        f"and the mean difference at least {points:.2f} points, or {FLOOR_ROUNDS:g} round "
        "for rounds to a target), negligible (the interval excludes 0, the mean difference is "
        "smaller), within noise (the interval contains 0), too few seeds (fewer than 2 pairs). "
        "A metric of the curve is taken, in each pair, over the rounds both runs evaluated "
        "(column rounds: first-last, the step, and how many). Left out: seeds not paired, by "
        "whose run (algorithm, reference or both) has no value and why: a diverged run has none "
        "for the final accuracy and the two means, a run that never reached the target none "
        "for the rounds to it; unmatched: a seed only one of the two has. A verdict (but too "
        f"few seeds) reads (early training) where the algorithm's curve or {reference}'s has "
        "not levelled off in that setting (see Has each curve levelled off?): the budget "
        "stopped before the plateau of the pair, so the difference may still change.\n\n"
    )
    tables = []
    rows = [r for group in cells.values() for r in group]
    for metric in paired_metrics(target, validated(rows)):
        compared_rows = compared(cells, reference, metric, floor)
        if compared_rows:
            table = paired_table(compared_rows, metric.unit, early)
            tables.append(f"### {metric.title}\n\n" + table)
    if not tables:
        return intro + f"No other algorithm ran in a setting of {reference}'s: nothing to compare."
    return intro + "\n\n".join(tables)
