"""Paper-style reports of a matrix spec: markdown tables (accuracy, rounds to target, cost per
round) and per-round curves (test accuracy and weight divergence)."""

from __future__ import annotations

import math
import platform
import warnings
from collections import defaultdict
from collections.abc import Callable
from datetime import date
from pathlib import Path

import numpy as np
from rich.console import Console

from fedhet.core.errors import DivergedError
from fedhet.core.spec import Spec
from fedhet.core.store import ArtifactStore
from fedhet.metrics.summary import rounds_to_reach
from fedhet.reports.plots import metric_curves
from fedhet.runs import execute, result_row, runs_of, stored_metrics

CURVES = {"test_accuracy": "test accuracy", "divergence": "weight divergence"}


def _mean(values) -> float:
    """Mean of the non-NaN values; NaN when there are none (a run that diverged at once)."""
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    return float(values.mean()) if values.size else math.nan


def _percent(values: list[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    mean = 100 * float(np.mean(values))
    if len(values) == 1:
        return f"{mean:.2f}"
    return f"{mean:.2f} ± {100 * float(np.std(values)):.2f}"


def _rounds(values: list[int | str]) -> str:
    """Mean rounds over the runs that reached the target, and how many did."""
    reached = [v for v in values if v != "never"]
    if not reached:
        return "never"
    mean = f"{float(np.mean(reached)):.1f}"
    return mean if len(reached) == len(values) else f"{mean} ({len(reached)}/{len(values)})"


def collect(spec: Spec, store: ArtifactStore, console: Console) -> list[dict]:
    """One row per run. A run that diverges is a result too: its row holds the rounds before
    the divergence and `diverged` (the round), and the other runs go on."""
    rows = []
    for run in runs_of(spec):
        try:
            metrics, diverged = stored_metrics(execute(run, store)), None
        except DivergedError as error:
            metrics, diverged = error.metrics, error.round_number
            console.print(
                f"{run.algorithm_label}, {run.setting_label}, seed {run.spec.seed}: {error}"
            )
        row = result_row(run, metrics)
        row["metrics"] = {name: np.asarray(values, dtype=float) for name, values in metrics.items()}
        row["diverged"] = diverged
        rows.append(row)
    return rows


def with_rounds_to_reference(rows: list[dict]) -> tuple[list[dict], str]:
    """Each row plus `rounds_to_reference`: rounds to the mean best accuracy of the matrix's
    first algorithm in the same setting (the papers' "speedup" column)."""
    reference = rows[0]["algorithm"]
    bests: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r["algorithm"] == reference:
            bests[r["setting"]].append(r["best_accuracy"])
    targets = {setting: _mean(values) for setting, values in bests.items()}
    out = []
    for r in rows:
        reached = rounds_to_reach(r["metrics"]["test_accuracy"], targets[r["setting"]])
        out.append({**r, "rounds_to_reference": "never" if reached is None else reached})
    return out, reference


def markdown_table(
    rows: list[dict], metric: str = "best_accuracy", cell: Callable[[list], str] = _percent
) -> str:
    """Algorithms x settings, each cell summarizing `metric` over the seeds."""
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        cells[r["algorithm"], r["setting"]].append(r)
    lines = ["| algorithm | " + " | ".join(settings) + " |", "|---" * (len(settings) + 1) + "|"]
    for algo in algorithms:
        texts = [
            cell([r[metric] for r in cells[algo, s]]) + _diverged(cells[algo, s]) for s in settings
        ]
        lines.append(f"| {algo} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def _diverged(runs: list[dict]) -> str:
    count = sum(r["diverged"] is not None for r in runs)
    return f" † {count}/{len(runs)}" if count else ""


def cost_table(rows: list[dict]) -> str:
    """Mean cost of one round per algorithm and setting; wall time also relative to the
    setting's first algorithm."""
    grouped: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        grouped[r["algorithm"], r["setting"]].append(r["metrics"])
    per_round = {
        key: {
            name: _mean([_mean(m[name]) for m in runs])
            for name in ("wall_time", "bytes_up", "bytes_down", "comm_rounds")
        }
        for key, runs in grouped.items()
    }
    first_of_setting: dict[str, float] = {}
    lines = [
        "| algorithm | setting | s / round | x first | MB up / round | MB down / round "
        "| round trips / round |",
        "|---|---|---|---|---|---|---|",
    ]
    for (algo, setting), cost in per_round.items():
        base = first_of_setting.setdefault(setting, cost["wall_time"])
        lines.append(
            f"| {algo} | {setting} | {cost['wall_time']:.3f} | {cost['wall_time'] / base:.2f} "
            f"| {cost['bytes_up'] / 1e6:.3f} | {cost['bytes_down'] / 1e6:.3f} "
            f"| {cost['comm_rounds']:.1f} |"
        )
    return "\n".join(lines)


def per_seed_table(rows: list[dict]) -> str:
    lines = [
        "| algorithm | setting | seed | best | final | rounds to target |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        final = f"{100 * r['final_accuracy']:.2f}"
        if r["diverged"] is not None:
            final = f"diverged in round {r['diverged']}"
        lines.append(
            f"| {r['algorithm']} | {r['setting']} | {r['seed']} | {100 * r['best_accuracy']:.2f} "
            f"| {final} | {r.get('rounds_to_target', '-')} |"
        )
    return "\n".join(lines)


def mean_curves(rows: list[dict], metric: str) -> dict[str, dict[str, np.ndarray]]:
    """curves[setting][algorithm] = the metric per round, averaged over seeds."""
    grouped: dict[str, dict[str, list[np.ndarray]]] = defaultdict(lambda: defaultdict(list))
    rounds = max(len(r["metrics"][metric]) for r in rows)
    for r in rows:  # a diverged run's curve ends early: NaN after its end
        values = r["metrics"][metric]
        padded = np.pad(values, (0, rounds - len(values)), constant_values=np.nan)
        grouped[r["setting"]][r["algorithm"]].append(padded)
    with warnings.catch_warnings():  # a metric a method does not measure is all NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return {
            s: {a: np.nanmean(np.stack(c), axis=0) for a, c in algos.items()}
            for s, algos in grouped.items()
        }


def write_report(
    spec: Spec, store: ArtifactStore, out_dir: Path, console: Console | None = None
) -> tuple[Path, Path]:
    rows = collect(spec, store, console or Console(stderr=True))
    out_dir.mkdir(parents=True, exist_ok=True)
    md, png = out_dir / f"{spec.name}.md", out_dir / f"{spec.name}.png"
    metric_curves({label: mean_curves(rows, m) for m, label in CURVES.items()}, png, spec.name)
    header = (
        f"# {spec.name}\n\n{spec.description.strip()}\n\n"
        f"Best test accuracy (%), mean ± std over seeds. Generated {date.today()} on "
        f"{platform.machine()} ({platform.system()}) by `fedhet report`.\n\n"
    )
    if any(r["diverged"] is not None for r in rows):
        header += (
            "† k/n: k of the cell's n runs diverged (non-finite loss or model); they count with "
            "the rounds before the divergence.\n\n"
        )
    sections = [markdown_table(rows)]
    target = spec.eval.target_accuracy
    if target is not None:
        sections.append(
            f"## Rounds to {100 * target:.2f}% test accuracy\n\nMean over the seeds that reached "
            "it (how many did, when not all).\n\n"
            + markdown_table(rows, "rounds_to_target", _rounds)
        )
    rows, reference = with_rounds_to_reference(rows)
    sections.append(
        f"## Rounds to {reference}'s best accuracy\n\nRounds until the test accuracy first "
        f"reaches {reference}'s mean best accuracy (over seeds) in the same setting; mean over "
        "the seeds that reached it (how many did, when not all).\n\n"
        + markdown_table(rows, "rounds_to_reference", _rounds)
    )
    sections += [
        "## Cost per round\n\nMeans over rounds and seeds; wall time includes evaluation rounds; "
        "a round trip is one server-client exchange.\n\n" + cost_table(rows),
        "## Per run\n\n" + per_seed_table(rows),
        f"![curves]({png.name})\n",
    ]
    md.write_text(header + "\n\n".join(sections))
    return md, png
