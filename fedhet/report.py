"""Paper-style reports of a matrix spec: a markdown table and accuracy curves."""

from __future__ import annotations

import math
import platform
from collections import defaultdict
from datetime import date
from pathlib import Path

import numpy as np

from fedhet.plots import accuracy_curves
from fedhet.runs import execute, result_row, runs_of
from fedhet.spec import Spec
from fedhet.store import ArtifactStore


def _cell(values: list[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    mean = 100 * float(np.mean(values))
    if len(values) == 1:
        return f"{mean:.2f}"
    return f"{mean:.2f} ± {100 * float(np.std(values)):.2f}"


def collect(spec: Spec, store: ArtifactStore) -> list[dict]:
    rows = []
    for run in runs_of(spec):
        group = execute(run, store)
        row = result_row(run, group)
        row["curve"] = np.asarray(group["metrics"]["test_accuracy"][:])
        rows.append(row)
    return rows


def markdown_table(rows: list[dict], metric: str = "best_accuracy") -> str:
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        cells[r["algorithm"], r["setting"]].append(r[metric])
    lines = ["| algorithm | " + " | ".join(settings) + " |", "|---" * (len(settings) + 1) + "|"]
    for algo in algorithms:
        lines.append(f"| {algo} | " + " | ".join(_cell(cells[algo, s]) for s in settings) + " |")
    return "\n".join(lines)


def per_seed_table(rows: list[dict]) -> str:
    lines = [
        "| algorithm | setting | seed | best | final | rounds to target |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['algorithm']} | {r['setting']} | {r['seed']} | {100 * r['best_accuracy']:.2f} "
            f"| {100 * r['final_accuracy']:.2f} | {r.get('rounds_to_target', '-')} |"
        )
    return "\n".join(lines)


def mean_curves(rows: list[dict]) -> dict[str, dict[str, np.ndarray]]:
    grouped: dict[str, dict[str, list[np.ndarray]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        grouped[r["setting"]][r["algorithm"]].append(r["curve"])
    return {
        s: {a: np.nanmean(np.stack(c), axis=0) for a, c in algos.items()}
        for s, algos in grouped.items()
    }


def write_report(spec: Spec, store: ArtifactStore, out_dir: Path) -> tuple[Path, Path]:
    rows = collect(spec, store)
    out_dir.mkdir(parents=True, exist_ok=True)
    md, png = out_dir / f"{spec.name}.md", out_dir / f"{spec.name}.png"
    accuracy_curves(mean_curves(rows), png, title=spec.name)
    header = (
        f"# {spec.name}\n\n{spec.description.strip()}\n\n"
        f"Best test accuracy (%), mean ± std over seeds. Generated {date.today()} on "
        f"{platform.machine()} ({platform.system()}) by `fedhet report`.\n\n"
    )
    body = (
        markdown_table(rows)
        + "\n\n## Per run\n\n"
        + per_seed_table(rows)
        + f"\n\n![curves]({png.name})\n"
    )
    md.write_text(header + body)
    return md, png
