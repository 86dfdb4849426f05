"""The report's paired comparisons: in every setting, each algorithm against the reference
algorithm, run by run over the seeds both have (fedhet.metrics.paired), for each metric below.

A diverged run keeps the values of the metrics it reached before diverging (its best accuracy,
the round it reached the target) and has none for the metrics of the end of a run or of the
whole run (final accuracy, the last tenth's mean, the mean over all evaluated rounds)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fedhet.metrics.paired import CONFIDENCE, Comparison, Pairing, Value, compare, pair
from fedhet.metrics.summary import best_label, evaluated_mean, tail_mean

DIVERGED = "diverged"
NEVER_REACHED = "never reached"
NOT_EVALUATED = "not evaluated"


@dataclass(frozen=True)
class PairedMetric:
    title: str
    value: Callable[[dict], Value]  # a report row -> its value, or why it has none
    unit: str = "points"  # differences shown in percentage points, or in rounds
    higher_is_better: bool = True


def _measured(value: float) -> Value:
    return NOT_EVALUATED if math.isnan(value) else value


def _whole_run(accuracy: Callable[[dict], float]) -> Callable[[dict], Value]:
    """A metric of the end of the run or of all of it: none for a diverged run."""
    return lambda row: DIVERGED if row["diverged"] is not None else _measured(accuracy(row))


def _rounds_to_target(row: dict) -> Value:
    rounds = row["rounds_to_target"]
    if rounds != "never":
        return float(rounds)
    return DIVERGED if row["diverged"] is not None else NEVER_REACHED


def paired_metrics(target: float | None, best: str = best_label([])) -> list[PairedMetric]:
    """The metrics compared; `best` names the rows' best accuracy (summary.best_label)."""
    metrics = [
        PairedMetric(best, lambda r: _measured(r["best_accuracy"])),
        PairedMetric("Final test accuracy", _whole_run(lambda r: r["final_accuracy"])),
        PairedMetric(
            "Mean test accuracy over the last tenth of the evaluated rounds",
            _whole_run(lambda r: tail_mean(r["metrics"]["test_accuracy"])),
        ),
        PairedMetric(
            "Mean test accuracy over all evaluated rounds (area under the curve)",
            _whole_run(lambda r: evaluated_mean(r["metrics"]["test_accuracy"])),
        ),
    ]
    if target is not None:
        metrics.append(
            PairedMetric(
                f"Rounds to {100 * target:.2f}% test accuracy (rounds saved: reference minus "
                "algorithm)",
                _rounds_to_target,
                unit="rounds",
                higher_is_better=False,
            )
        )
    return metrics


@dataclass(frozen=True)
class PairedRow:
    algorithm: str
    setting: str
    pairing: Pairing
    comparison: Comparison


def compared(
    cells: Mapping[tuple[str, str], list[dict]], reference: str, metric: PairedMetric
) -> list[PairedRow]:
    """Every other algorithm against `reference` in each setting where the reference ran."""
    out = []
    for (algorithm, setting), group in cells.items():
        baseline = cells.get((reference, setting))
        if algorithm == reference or baseline is None:
            continue
        pairing = pair(
            {r["seed"]: metric.value(r) for r in group},
            {r["seed"]: metric.value(r) for r in baseline},
            metric.higher_is_better,
        )
        out.append(PairedRow(algorithm, setting, pairing, compare(pairing.differences)))
    return out


def paired_table(rows: list[PairedRow], unit: str) -> str:
    def signed(value: float) -> str:  # a fraction of accuracy in points, rounds as they are
        return f"{100 * value:+.2f}" if unit == "points" else f"{value:+.1f}"

    lines = [
        f"| algorithm | setting | pairs | mean difference ({unit}) | {100 * CONFIDENCE:.0f}% CI "
        "| seeds ahead | verdict | left out |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        c = row.comparison
        mean = "-" if c.n == 0 else signed(c.mean)
        interval = "-" if c.low is None else f"[{signed(c.low)}, {signed(c.high)}]"
        lines.append(
            f"| {row.algorithm} | {row.setting} | {c.n} | {mean} | {interval} | {c.ahead}/{c.n} "
            f"| {c.verdict} | {_left_out(row.pairing.left_out)} |"
        )
    return "\n".join(lines)


def _left_out(reasons: dict[str, int]) -> str:
    return ", ".join(f"{n} {reason}" for reason, n in reasons.items()) or "-"


def paired_section(
    cells: Mapping[tuple[str, str], list[dict]], reference: str, target: float | None
) -> str:
    """One paired table per metric, or a line saying there is nothing to compare."""
    intro = (
        f"## Paired differences against {reference}\n\nIn each setting, every other algorithm "
        f"minus {reference}, run by run over the seeds both have (pairs); mean difference, its "
        f"{100 * CONFIDENCE:.0f}% Student t interval over the pairs (df = pairs - 1), the pairs "
        "whose difference is > 0, and the verdict: ahead (interval above 0), behind (below 0), "
        "within noise (contains 0), too few seeds (fewer than 2 pairs). Left out: seeds not "
        "paired, by whose run (algorithm, reference or both) has no value and why: a diverged "
        "run has none for the final accuracy and the two means, a run that never reached the "
        "target none for the rounds to it; unmatched: a seed only one of the two has.\n\n"
    )
    tables = []
    best = best_label(r for group in cells.values() for r in group)
    for metric in paired_metrics(target, best):
        rows = compared(cells, reference, metric)
        if rows:
            tables.append(f"### {metric.title}\n\n" + paired_table(rows, metric.unit))
    if not tables:
        return intro + f"No other algorithm ran in a setting of {reference}'s: nothing to compare."
    return intro + "\n\n".join(tables)
