"""Paper-style reports of a matrix spec: markdown tables (accuracy, rounds to target, cost per
round) and per-round curves (test accuracy and weight divergence).

Under them, paired comparisons of every algorithm with a reference (fedhet.reports.comparison).

A table cell summarizes one group of runs: runs whose configurations differ only in the seed
(`Run.group`). Rows and columns are the groups' labels, which are unique per group, so two
configurations are never averaged together.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from datetime import date
from pathlib import Path

import numpy as np
from rich.console import Console

from fedhet.core.errors import InputError
from fedhet.core.files import write_atomically
from fedhet.core.spec import Spec
from fedhet.core.store import ArtifactStore
from fedhet.execution.labels import named_label
from fedhet.execution.planning import Run
from fedhet.figures import FORMATS, Curve, measured, metric_curves
from fedhet.metrics.summary import rounds_to_reach, validated
from fedhet.reports import personalized
from fedhet.reports.collection import collect, environments, with_final_scores
from fedhet.reports.comparison import FLOOR_ACCURACY, paired_section
from fedhet.reports.distillation import distillation_section
from fedhet.reports.heterogeneity import heterogeneity_section
from fedhet.reports.plateau import early_pairs, plateau_section
from fedhet.reports.tables import (
    cells,
    cost_table,
    markdown_table,
    nan_mean,
    own_angle_section,
    per_seed_table,
    percent_cell,
    rounds_cell,
    stage_table,
    uneven_round_times,
)

CURVES = {"test_accuracy": "test accuracy", "divergence": "weight divergence"}
PERCENT_CURVES = ("test accuracy",)
LINES_CAPTION = "Lines: the mean over a cell's seeds in each round."
LINES_CAPTION_DIVERGED = (
    "Lines: the mean over a cell's seeds in each round, of the runs that did not diverge."
)
CURVE_CAPTIONS = {
    "weight divergence": "Weight divergence: the mean over a round's clients of the L2 distance "
    "between the client's model and the new global model."
}
# What "test accuracy" means for a personalized method's run (fedhet.engine.own_evaluation)
PERSONALIZED_TEST = (
    "Test accuracy of a personalized method (one whose clients each use a model of their own: "
    "FedBN, FedPer, Ditto, FedAvg-FT, Local, ...), in every table and curve: each client's own "
    "model on its own test split (eval.client_test), the mean over the clients weighted by their "
    "training samples (for the final model, the Personalized accuracy section's weighted mean); "
    "a global-model method's is its model on the test set."
)


def reference_algorithm(
    runs: list[Run], baseline: str | None, console: Console, given: str = ""
) -> str:
    """The algorithm label the others are compared with: `baseline` (a label, or one in the
    style of labels before, with a note on `console`), else the matrix's first. `given`: the
    baseline as the caller gave it (`--baseline 'x'`, `baseline='x'`)."""
    labels = list(dict.fromkeys(run.algorithm_label for run in runs))
    if baseline is None:
        return labels[0]
    given = given or f"--baseline {baseline!r}"
    named = named_label(baseline, labels)
    if named is None:
        raise InputError(
            f"{given} is no algorithm of this report; choose one of: "
            + ", ".join(repr(label) for label in labels)
        )
    if named != baseline:
        console.print(
            f"note: {given} read as {named!r}, the label reports now use",
            markup=False,
            soft_wrap=True,
        )
    return named


def with_rounds_to_reference(rows: list[dict], reference: str) -> list[dict]:
    """Each row plus `rounds_to_reference`: rounds to the mean best accuracy of the reference
    algorithm in the same setting (the papers' "speedup" column)."""
    targets = {
        setting: nan_mean([r["best_test"] for r in group])
        for (algorithm, setting), group in cells(rows).items()
        if algorithm == reference
    }
    out = []
    for r in rows:
        rounds: int | str | None = None
        if r["setting"] in targets:
            rounds = rounds_to_reach(r["metrics"]["test_accuracy"], targets[r["setting"]])
            rounds = "never" if rounds is None else rounds
        out.append({**r, "rounds_to_reference": rounds})
    return out


def seed_curves(rows: list[dict], metric: str) -> dict[str, dict[str, Curve]]:
    """curves[setting][algorithm] = the metric per round over the group's seeds (mean and
    standard deviation of the seeds measured in that round) that did not diverge, beside each
    diverged run's curve to its divergence (so its end does not make the mean jump)."""
    rounds = max(len(r["metrics"][metric]) for r in rows)
    curves: dict[str, dict[str, Curve]] = defaultdict(dict)
    with warnings.catch_warnings():  # a metric a method does not measure is all NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        for (algorithm, setting), group in cells(rows).items():
            kept = [_defined(r, metric) for r in group if r["diverged"] is None]
            stacked = np.stack(
                [np.pad(v, (0, rounds - len(v)), constant_values=np.nan) for v in kept]
                or [np.full(rounds, np.nan)]
            )
            mean, std = np.nanmean(stacked, axis=0), np.nanstd(stacked, axis=0)
            diverged = tuple(_defined(r, metric) for r in group if r["diverged"] is not None)
            curves[setting][algorithm] = Curve(mean, std, len(kept), diverged)
    return dict(curves)


def _defined(row: dict, metric: str) -> np.ndarray:
    """The run's metric per round; all NaN where its method does not define it."""
    values = np.asarray(row["metrics"][metric], dtype=float)
    return np.full_like(values, np.nan) if metric in row.get("undefined", ()) else values


def stage_boundaries(rows: list[dict]) -> dict[str, list[int]]:
    """algorithm label -> the rounds after which its runs start a new stage (TCT's stage 2)."""
    return {r["algorithm"]: r["stage_starts"] for r in rows if r.get("stage_starts")}


def later_stage_setup(rows: list[dict]) -> str:
    """What the cost section says of runs with a second stage: its first round's setup is in
    their times."""
    staged = sorted(stage_boundaries(rows))
    if not staged:
        return ""
    return (
        f" The first round of {', '.join(staged)}'s second stage also holds that stage's one-off "
        "setup (TCT's: computing the eNTK features), which these times include."
    )


# Where a report goes unless told: never the repository's committed reports/, which only
# `make reproduce` and `make readme` write (with --out reports)
DEFAULT_FOLDER = Path("report")


def curve_panels(rows: list[dict]) -> tuple[dict[str, dict[str, dict[str, Curve]]], list[str]]:
    """The figure's rows of panels (test accuracy always, another metric where a run records
    it) and the caption lines that explain what is drawn."""
    panels = {label: seed_curves(rows, m) for m, label in CURVES.items()}
    first = next(iter(panels))
    panels = {label: c for label, c in panels.items() if label == first or measured(c)}
    diverged = any(r["diverged"] is not None for r in rows)
    captions = [LINES_CAPTION_DIVERGED if diverged else LINES_CAPTION]
    captions += [CURVE_CAPTIONS[label] for label in panels if label in CURVE_CAPTIONS]
    undrawn = [a for a in _labels(rows) if not any(measured(c, a) for c in panels.values())]
    if undrawn:
        captions.append(f"No curve for {', '.join(undrawn)}: {_why_undrawn(rows, undrawn)}.")
    if "weight divergence" in panels:
        drawn = [r for r in rows if r["algorithm"] not in undrawn]
        captions += without_divergence(drawn, panels["weight divergence"])
    return panels, captions


def _why_undrawn(rows: list[dict], algorithms: list[str]) -> str:
    runs = [r for r in rows if r["algorithm"] in algorithms]
    if all(r["diverged"] is not None for r in runs):
        return "every run diverged before its first value"
    return "no run recorded a value"


def _labels(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["algorithm"] for r in rows))


def without_divergence(rows: list[dict], curves: dict[str, dict[str, Curve]]) -> list[str]:
    """The caption lines naming the algorithms drawn without a weight-divergence curve: those
    whose method defines none, and those whose runs record none (TCT's)."""
    undefined = list(dict.fromkeys(r["algorithm"] for r in rows if "divergence" in r["undefined"]))
    unrecorded = [a for a in _labels(rows) if a not in undefined and not measured(curves, a)]
    lines = []
    if undefined:
        names = ", ".join(undefined)
        lines.append(f"No weight divergence for {names}: no client models around a global one.")
    if unrecorded:
        whose = "its" if len(unrecorded) == 1 else "their"
        lines.append(f"No weight divergence for {', '.join(unrecorded)}: {whose} runs record none.")
    return lines


def write_report(
    spec: Spec,
    runs: list[Run],
    store: ArtifactStore,
    out_dir: Path,
    console: Console | None = None,
    train: bool = False,
    baseline: str | None = None,
    floor: float = FLOOR_ACCURACY,
    tuning: str | None = None,
) -> tuple[Path, Path]:
    """The report of `runs` into `out_dir` (markdown and curves); the paired comparisons are
    against `baseline` (an algorithm label), else the matrix's first algorithm, and call a
    difference a gain from `floor` (a fraction of accuracy) up. `tuning`: the section that says
    how the runs' configurations were tuned (`fedhet report --tuned`)."""
    console = console or Console(stderr=True)
    reference = reference_algorithm(runs, baseline, console)
    rows = collect(runs, store, console, train)
    md, png = out_dir / f"{spec.name}.md", out_dir / f"{spec.name}.png"
    panels, captions = curve_panels(rows)
    metric_curves(panels, png, spec.name, stage_boundaries(rows), FORMATS, PERCENT_CURVES, captions)
    header = (
        f"# {spec.name}\n\n{spec.description.strip()}\n\n"
        "Best test accuracy (the papers' metric), in %: mean ± standard deviation over seeds "
        "(np.std, ddof=0; no "
        f"± for one seed), n = the number of seeds. Generated {date.today()} by `fedhet report` "
        f"from runs computed in:\n\n{environments(rows)}\n\n"
    )
    if spec.eval.client_test is not None and any(r.spec.algorithm.personalized for r in runs):
        header += PERSONALIZED_TEST + "\n\n"
    if any(r["diverged"] is not None for r in rows):
        header += (
            "† k/n: k of the cell's n runs diverged (non-finite loss or model); they count with "
            "the rounds before the divergence.\n\n"
        )
    sections = [markdown_table(rows), *([tuning] if tuning else [])]
    if validated(rows):
        sections.append(
            "## Test accuracy at the best validation round\n\nThe model selection of a run with "
            "a validation split, in %: mean ± standard deviation over seeds.\n\n"
            + markdown_table(rows, "test_at_best_val")
        )
    target = spec.eval.target_accuracy
    if target is not None:
        sections.append(
            f"## Rounds to {100 * target:.2f}% test accuracy\n\nMean over the seeds that reached "
            "it (k/n: k of the cell's n seeds did).\n\n"
            + markdown_table(rows, "rounds_to_target", rounds_cell)
        )
    rows = with_rounds_to_reference(rows, reference)
    sections.append(
        f"## Rounds to {reference}'s best accuracy\n\nRounds until the test accuracy first "
        f"reaches {reference}'s mean best accuracy (over seeds) in the same setting; mean over "
        "the seeds that reached it (k/n: k of the cell's n seeds did).\n\n"
        + markdown_table(rows, "rounds_to_reference", rounds_cell)
    )
    early = early_pairs(cells(rows), reference)
    sections.append(paired_section(cells(rows), reference, target, floor, early))
    sections.append(plateau_section(cells(rows), reference))
    sections += filter(None, [distillation_section(cells(rows), floor)])
    rotated = any(run.spec.partition.rotation is not None for run in runs)
    if spec.eval.client_test is not None or rotated:
        rows = with_final_scores(rows, runs, store, console)
    if rotated:
        sections.append(own_angle_section(rows))
    if spec.eval.client_test is not None:
        figure = out_dir / f"{spec.name}-personalized.png"
        section = personalized.section(cells(rows), reference, floor, percent_cell, figure, early)
        sections.append(section)
    sections += filter(None, [heterogeneity_section(runs, store)])
    sections += [
        "## Cost per round\n\nMeans over rounds and seeds; wall time includes evaluation rounds "
        "and leaves out each run's first round (it holds one-off warm-up: imports, first "
        "allocations), and x first is it relative to the setting's first algorithm; a round "
        f"trip is one server-client exchange.{later_stage_setup(rows)}\n\n"
        + "\n\n".join(filter(None, [uneven_round_times(rows), cost_table(rows)])),
        "## Seconds per stage\n\nMean over seeds of the time each stored stage took to compute "
        "(a resumed stage: its last attempt; a stage shared by several runs counts in each; no "
        "total where every run diverged).\n\n" + stage_table(rows),
        "## Per run\n\n" + per_seed_table(rows),
        f"![curves]({png.name})\n",
    ]
    write_atomically(md, (header + "\n\n".join(sections)).encode())
    return md, png


def summary(md: Path) -> str:
    """What a terminal shows of the report `write_report` wrote into `md`: its header and main
    table, then the rest's section titles and the files that hold it all."""
    text = md.read_text()
    head, _, rest = text.partition("\n## ")
    titles = [line[3:] for line in f"## {rest}".splitlines() if line.startswith("## ")]
    figures = [md.with_suffix(f".{fmt}") for fmt in FORMATS]
    personal = md.with_name(f"{md.stem}-personalized.png")
    if f"]({personal.name})" in text:  # its personalized section draws it
        figures.append(personal)
    return (
        f"{head.rstrip()}\n\nThe full report, {md}, also has: " + "; ".join(titles) + "."
        f"\nCurves: {', '.join(map(str, figures))}"
    )
