"""The tables of a report: algorithms x settings, each cell one group of runs summarized over
its seeds (`cells`), and the tables of cost, stages and single runs."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable

import numpy as np

from fedhet.core import units
from fedhet.metrics.summary import validated


def nan_mean(values) -> float:
    """Mean of the non-NaN values; NaN when there are none (a run that diverged at once)."""
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    return float(values.mean()) if values.size else math.nan


def percent_cell(values: list[float]) -> str:
    """Mean ± standard deviation (np.std: ddof=0) in % of the measured values, and how many
    seeds the cell holds; no ± for a single value."""
    measured = [v for v in values if not math.isnan(v)]
    if not measured:
        return f"- (n={len(values)})"
    mean = f"{units.percent(float(np.mean(measured))):.2f}"
    if len(measured) > 1:
        mean += f" ± {units.percent(float(np.std(measured))):.2f}"
    return f"{mean} (n={len(values)})"


def rounds_cell(values: list[int | str | None]) -> str:
    """Mean rounds over the runs that reached the target, and how many of how many did."""
    if None in values:  # no target: the reference algorithm did not run in this setting
        return "-"
    reached = [v for v in values if v != "never"]
    mean = f"{float(np.mean(reached)):.1f}" if reached else "never"
    return f"{mean} ({len(reached)}/{len(values)})"


def cells(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """(algorithm, setting) -> the rows of the one group with those labels."""
    grouped: dict[tuple[str, str], list[dict]] = defaultdict(list)
    owner: dict[tuple[str, str], str] = {}
    for r in rows:
        label = r["algorithm"], r["setting"]
        if owner.setdefault(label, r["group"]) != r["group"]:
            raise ValueError(f"two configurations share the labels {label}; they must not mix")
        grouped[label].append(r)
    return grouped


def markdown_table(
    rows: list[dict], metric: str = "best_test", cell: Callable[[list], str] = percent_cell
) -> str:
    """Algorithms x settings, each cell summarizing `metric` over the seeds of one group."""
    grouped = cells(rows)
    settings = list(dict.fromkeys(setting for _, setting in grouped))
    algorithms = list(dict.fromkeys(algorithm for algorithm, _ in grouped))
    lines = ["| algorithm | " + " | ".join(settings) + " |", "|---" * (len(settings) + 1) + "|"]
    for algo in algorithms:
        texts = [_cell(grouped.get((algo, s), []), metric, cell) for s in settings]
        lines.append(f"| {algo} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def _cell(group: list[dict], metric: str, cell: Callable[[list], str]) -> str:
    if not group:  # a combination the matrix does not have
        return "-"
    diverged = sum(r["diverged"] is not None for r in group)
    mark = f" † {diverged}/{len(group)}" if diverged else ""
    return cell([r.get(metric, math.nan) for r in group]) + mark


def own_angle_section(rows: list[dict]) -> str:
    return (
        "## Accuracy at each class's own training angle\n\nThe final model on the test set "
        "with every image rotated by its class's own training angle (the angle of the client "
        "holding most of the class's training samples), where the test set above shows every "
        "class at every client's angle. Far above the test accuracy, it says the model learned "
        "orientation as part of the label: class and angle are confounded in training. Over "
        "the seeds: mean ± std (%).\n\n" + markdown_table(rows, "own_angle")
    )


def cost_table(rows: list[dict]) -> str:
    """Mean cost of one round per group; wall time also relative to the setting's first
    algorithm. The wall time leaves out each run's first round (`after_warm_up`)."""
    first_of_setting: dict[str, float] = {}
    lines = [
        "| algorithm | setting | seeds | s / round | x first | MB up / round | MB down / round "
        "| round trips / round |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (algo, setting), group in cells(rows).items():
        cost = {
            name: nan_mean([nan_mean(r["metrics"][name]) for r in group])
            for name in ("bytes_up", "bytes_down", "comm_rounds")
        }
        cost["wall_time"] = nan_mean(
            [nan_mean(after_warm_up(r["metrics"]["wall_time"])) for r in group]
        )
        base = first_of_setting.setdefault(setting, cost["wall_time"])
        lines.append(
            f"| {algo} | {setting} | {len(group)} | {cost['wall_time']:.3f} "
            f"| {cost['wall_time'] / base:.2f} | {cost['bytes_up'] / 1e6:.3f} "
            f"| {cost['bytes_down'] / 1e6:.3f} | {cost['comm_rounds']:.1f} |"
        )
    return "\n".join(lines)


LOAD_SPREAD = 2.0  # runs of one configuration whose round times differ more: the load changed


def uneven_round_times(rows: list[dict]) -> str:
    """A sentence when, in some group, one run's median round time is over LOAD_SPREAD times
    another's: runs of one configuration do the same work, so the machine's load (or a pause)
    changed while they ran, and their times do not measure the method's cost; "" otherwise."""
    spreads, groups = {}, cells(rows)
    for label, group in groups.items():
        times = [after_warm_up(r["metrics"]["wall_time"]) for r in group]
        medians = [float(np.nanmedian(t)) for t in times if np.isfinite(t).any()]
        medians = [m for m in medians if m > 0]  # a run that diverged in round 1 has none
        if len(medians) > 1 and max(medians) > LOAD_SPREAD * min(medians):
            spreads[label] = min(medians), max(medians)
    if not spreads:
        return ""
    (algo, setting), (low, high) = max(spreads.items(), key=lambda kv: kv[1][1] / kv[1][0])
    return (
        f"Caution: in {len(spreads)} of {len(groups)} groups one run's median round time "
        f"is over {LOAD_SPREAD:g} times another's (the most: {algo}, {setting}, {low:.2f} to "
        f"{high:.2f} s): runs of one configuration do the same work, so the machine's load "
        "changed while they ran, and these times, the x first ratios and the seconds per stage "
        "below do not measure the methods' cost."
    )


def after_warm_up(seconds: np.ndarray) -> np.ndarray:
    """A run's round times less its first round, which holds one-off work (the process's
    imports and first allocations: 2.3 s against 0.1 s a round for quickstart's first run);
    a run of one round keeps it."""
    return seconds[1:] if len(seconds) > 1 else seconds


def stage_table(rows: list[dict]) -> str:
    """Mean seconds per stage of each group's runs, and their sum."""
    stages = list(dict.fromkeys(stage for r in rows for stage in r["stage_seconds"]))
    lines = [
        "| algorithm | setting | seeds | " + " | ".join(f"{s} s" for s in stages) + " | total s |",
        "|---|---|---|" + "---|" * (len(stages) + 1),
    ]
    for (algo, setting), group in cells(rows).items():
        means = [nan_mean([r["stage_seconds"].get(s, math.nan) for r in group]) for s in stages]
        shown = ["-" if math.isnan(m) else f"{m:.1f}" for m in means]
        finished = any(r["diverged"] is None for r in group)  # none: no run to total
        total = f"{sum(m for m in means if not math.isnan(m)):.1f}" if finished else "-"
        lines.append(f"| {algo} | {setting} | {len(group)} | {' | '.join(shown)} | {total} |")
    return "\n".join(lines)


def per_seed_table(rows: list[dict]) -> str:
    """One line per run: its best test accuracy, with a validation split the test accuracy at
    its best validation round, and its final test accuracy (`summarize`)."""
    split = validated(rows)
    lines = [
        "| algorithm | setting | seed | best test % | "
        + ("test at best val % | " if split else "")
        + "final test % | rounds to target | key |",
        "|---|---|---|---|---|---|---|" + ("---|" if split else ""),
    ]
    for r in rows:
        final = f"{units.percent(r['final']):.2f}"
        if r["diverged"] is not None:
            final = f"diverged in round {r['diverged']}"
        at_val = f"{units.percent(r.get('test_at_best_val', math.nan)):.2f} | " if split else ""
        best = units.percent(r["best_test"])
        lines.append(
            f"| {r['algorithm']} | {r['setting']} | {r['seed']} | {best:.2f} "
            f"| {at_val}{final} | {r.get('rounds_to_target', '-')} | {r['key'][:12]} |"
        )
    return "\n".join(lines)
