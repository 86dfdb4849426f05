"""Paper-style reports of a matrix spec: markdown tables (accuracy, rounds to target, cost per
round) and per-round curves (test accuracy and weight divergence).

Under them, paired comparisons of every algorithm with a reference (fedhet.reports.comparison).

A table cell summarizes one group of runs: runs whose configurations differ only in the seed
(`Run.group`). Rows and columns are the groups' labels, which are unique per group, so two
configurations are never averaged together.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import date
from pathlib import Path

import numpy as np
from rich.console import Console

from fedhet.core import provenance, units
from fedhet.core.errors import InputError
from fedhet.core.files import write_atomically
from fedhet.core.spec import Spec
from fedhet.core.store import ArtifactStore
from fedhet.execution.planning import Run
from fedhet.execution.results import outcome, result_row
from fedhet.figures import FORMATS, Curve, metric_curves
from fedhet.metrics.summary import rounds_to_reach, validated
from fedhet.reports.comparison import FLOOR_ACCURACY, paired_section
from fedhet.reports.evaluation import evaluate_run
from fedhet.reports.plateau import plateau_section

CURVES = {"test_accuracy": "test accuracy", "divergence": "weight divergence"}
PERCENT_CURVES = ("test accuracy",)
CAPTIONS = (
    "Lines: the mean over a cell's seeds in each round.",
    "Weight divergence: the mean over a round's clients of the L2 distance between the client's "
    "model and the new global model.",
)
FINAL_METRICS = ("own_angle", "client_test_mean", "client_test_worst_decile", "client_test_std")
CLIENT_TEST_METRICS = {
    "client_test_mean": "Mean over clients",
    "client_test_worst_decile": "Worst 10% of clients (mean of the lowest ceil(K/10))",
    "client_test_std": "Spread over clients (std, ddof=0)",
}


def _mean(values) -> float:
    """Mean of the non-NaN values; NaN when there are none (a run that diverged at once)."""
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    return float(values.mean()) if values.size else math.nan


def _percent(values: list[float]) -> str:
    """Mean ± standard deviation (np.std: ddof=0) in % of the measured values, and how many
    seeds the cell holds; no ± for a single value."""
    measured = [v for v in values if not math.isnan(v)]
    if not measured:
        return f"- (n={len(values)})"
    mean = f"{units.percent(float(np.mean(measured))):.2f}"
    if len(measured) > 1:
        mean += f" ± {units.percent(float(np.std(measured))):.2f}"
    return f"{mean} (n={len(values)})"


def _rounds(values: list[int | str | None]) -> str:
    """Mean rounds over the runs that reached the target, and how many of how many did."""
    if None in values:  # no target: the reference algorithm did not run in this setting
        return "-"
    reached = [v for v in values if v != "never"]
    mean = f"{float(np.mean(reached)):.1f}" if reached else "never"
    return f"{mean} ({len(reached)}/{len(values)})"


def collect(runs: list[Run], store: ArtifactStore, console: Console, train: bool) -> list[dict]:
    """One row per run (runs with the same key count once). Without `train` every run must be
    stored (see `runs.require_stored`). A run that diverges is a result too: its row holds the
    rounds before the divergence and `diverged` (the round), and the other runs go on."""
    rows, seen = [], set()
    for run in runs:
        if run.node.key in seen:  # e.g. a matrix over a runtime setting: the same computation
            continue
        seen.add(run.node.key)
        reached = outcome(run, store, train)
        environment = None if reached.group is None else reached.group.attrs.get("environment")
        if reached.diverged is not None:
            console.print(f"{run.label}: {reached.diverged}", markup=False, soft_wrap=True)
        metrics = reached.metrics
        row = result_row(run, metrics)
        row.update(
            group=run.group,
            key=run.node.key,
            metrics={name: np.asarray(values, dtype=float) for name, values in metrics.items()},
            diverged=reached.diverged_round,
            environment=environment,
            environment_changes=provenance.changes(environment, run.spec.runtime),
            stage_seconds=stage_seconds(run, store),
            undefined=run.spec.algorithm.undefined_metrics,
            stage_starts=run.spec.algorithm.stage_starts(run.spec),
        )
        rows.append(row)
    _announce_other_environments(rows, console)
    return rows


def stage_seconds(run: Run, store: ArtifactStore) -> dict[str, float]:
    """Stage name -> seconds its stored artifact took to compute (the last attempt's, for a
    resumed stage), over the run's chain of stages; a stage not stored is left out."""
    return {
        node.stage: float(store.info(node.stage, node.key).attrs.get("wall_time_s", math.nan))
        for node in run.node.walk()
        if store.exists(node.stage, node.key)
    }


def _announce_other_environments(rows: list[dict], console: Console) -> None:
    """One line when some results were computed under another environment than this one."""
    changed = [r["environment_changes"] for r in rows if r["environment_changes"]]
    if changed:
        what = ", ".join(dict.fromkeys(change for changes in changed for change in changes))
        console.print(
            f"{len(changed)} of {len(rows)} runs were computed under another environment: "
            f"{what}; the report lists the environments",
            markup=False,
            soft_wrap=True,
        )


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


def reference_algorithm(runs: list[Run], baseline: str | None, given: str = "") -> str:
    """The algorithm label the others are compared with: `baseline`, else the matrix's first.
    `given`: the baseline as the caller gave it (`--baseline 'x'`, `baseline='x'`)."""
    labels = list(dict.fromkeys(run.algorithm_label for run in runs))
    if baseline is not None and baseline not in labels:
        raise InputError(
            f"{given or f'--baseline {baseline!r}'} is no algorithm of this report; choose one of: "
            + ", ".join(repr(label) for label in labels)
        )
    return labels[0] if baseline is None else baseline


def with_rounds_to_reference(rows: list[dict], reference: str) -> list[dict]:
    """Each row plus `rounds_to_reference`: rounds to the mean best accuracy of the reference
    algorithm in the same setting (the papers' "speedup" column)."""
    targets = {
        setting: _mean([r["best_test"] for r in group])
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


def markdown_table(
    rows: list[dict], metric: str = "best_test", cell: Callable[[list], str] = _percent
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


def with_final_scores(
    rows: list[dict], runs: list[Run], store: ArtifactStore, console: Console
) -> list[dict]:
    """Each row with the `fedhet eval` scores of its run's final model (FINAL_METRICS); NaN for
    a diverged run, or a metric its method does not measure."""
    by_key = {run.node.key: run for run in runs}
    scored = []
    for row in rows:
        run = by_key[row["key"]]
        measured = {}
        if row["diverged"] is None:
            group = store.open(run.node.stage, run.node.key)
            measured = evaluate_run(run, group, store, console=console)
        scored.append({**row, **{name: _number(measured.get(name)) for name in FINAL_METRICS}})
    return scored


def _number(value) -> float:
    return math.nan if value is None else float(value)


def own_angle_section(rows: list[dict]) -> str:
    return (
        "## Accuracy at each class's own training angle\n\nThe final model on the test set "
        "with every image rotated by its class's own training angle (the angle of the client "
        "holding most of the class's training samples), where the test set above shows every "
        "class at every client's angle. Far above the test accuracy, it says the model learned "
        "orientation as part of the label: class and angle are confounded in training. Over "
        "the seeds: mean ± std (%).\n\n" + markdown_table(rows, "own_angle")
    )


def client_test_section(rows: list[dict]) -> str:
    """Per-client accuracy of each run's final model on the clients' own test sets
    (`eval.client_test`): its mean, worst decile and spread over clients, each summarized over
    seeds. A diverged run, or a method that does not measure it, counts as not measured."""
    tables = [
        f"{title}\n\n" + markdown_table(rows, name) for name, title in CLIENT_TEST_METRICS.items()
    ]
    return (
        "## Per-client test accuracy\n\nEach client scored on its own test set (drawn from the "
        "test split in its training label proportions) with the final model it uses (its own BN "
        "entries for FedBN and SiloBN, else the global model); clients without samples are "
        "left out. Over the seeds: mean ± std (%) of each run's figure.\n\n" + "\n\n".join(tables)
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
            name: _mean([_mean(r["metrics"][name]) for r in group])
            for name in ("bytes_up", "bytes_down", "comm_rounds")
        }
        cost["wall_time"] = _mean([_mean(after_warm_up(r["metrics"]["wall_time"])) for r in group])
        base = first_of_setting.setdefault(setting, cost["wall_time"])
        lines.append(
            f"| {algo} | {setting} | {len(group)} | {cost['wall_time']:.3f} "
            f"| {cost['wall_time'] / base:.2f} | {cost['bytes_up'] / 1e6:.3f} "
            f"| {cost['bytes_down'] / 1e6:.3f} | {cost['comm_rounds']:.1f} |"
        )
    return "\n".join(lines)


def after_warm_up(seconds: np.ndarray) -> np.ndarray:
    """A run's round times less its first round, which holds one-off work (the process's
    imports and first allocations: 2.3 s against 0.1 s a round for quickstart's first run);
    a run of one round keeps it."""
    return seconds[1:] if len(seconds) > 1 else seconds


def stage_table(rows: list[dict]) -> str:
    """Mean seconds per stage of each group's runs, and their sum."""
    stages = list(dict.fromkeys(stage for r in rows for stage in r["stage_seconds"]))
    lines = [
        "| algorithm | setting | seeds | " + " | ".join(stages) + " | total |",
        "|---|---|---|" + "---|" * (len(stages) + 1),
    ]
    for (algo, setting), group in cells(rows).items():
        means = [_mean([r["stage_seconds"].get(s, math.nan) for r in group]) for s in stages]
        shown = ["-" if math.isnan(m) else f"{m:.1f}" for m in means]
        total = sum(m for m in means if not math.isnan(m))
        lines.append(f"| {algo} | {setting} | {len(group)} | {' | '.join(shown)} | {total:.1f} |")
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


def seed_curves(rows: list[dict], metric: str) -> dict[str, dict[str, Curve]]:
    """curves[setting][algorithm] = the metric per round over the group's seeds (mean and
    standard deviation of the seeds measured in that round)."""
    rounds = max(len(r["metrics"][metric]) for r in rows)
    curves: dict[str, dict[str, Curve]] = defaultdict(dict)
    with warnings.catch_warnings():  # a metric a method does not measure is all NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        for (algorithm, setting), group in cells(rows).items():
            stacked = np.stack(
                [  # a diverged run's curve ends early: NaN after its end
                    np.pad(
                        _defined(r, metric),
                        (0, rounds - len(r["metrics"][metric])),
                        constant_values=np.nan,
                    )
                    for r in group
                ]
            )
            mean, std = np.nanmean(stacked, axis=0), np.nanstd(stacked, axis=0)
            curves[setting][algorithm] = Curve(mean, std, len(group))
    return dict(curves)


def _defined(row: dict, metric: str) -> np.ndarray:
    """The run's metric per round; all NaN where its method does not define it."""
    values = np.asarray(row["metrics"][metric], dtype=float)
    return np.full_like(values, np.nan) if metric in row.get("undefined", ()) else values


def stage_boundaries(rows: list[dict]) -> dict[str, list[int]]:
    """algorithm label -> the rounds after which its runs start a new stage (TCT's stage 2)."""
    return {r["algorithm"]: r["stage_starts"] for r in rows if r.get("stage_starts")}


def environments(rows: list[dict]) -> str:
    """The distinct environments the rows were computed in, with how many runs each."""
    counts = Counter(
        "not stored (diverged)"
        if r["diverged"] is not None
        else provenance.summary(r["environment"])
        for r in rows
    )
    return "\n".join(f"- {env}: {n} run{'s' if n != 1 else ''}" for env, n in counts.most_common())


# Where a report goes unless told: never the repository's committed reports/, which only
# `make reproduce` and `make readme` write (with --out reports)
DEFAULT_FOLDER = Path("report")


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
    reference = reference_algorithm(runs, baseline)
    console = console or Console(stderr=True)
    rows = collect(runs, store, console, train)
    md, png = out_dir / f"{spec.name}.md", out_dir / f"{spec.name}.png"
    panels = {label: seed_curves(rows, m) for m, label in CURVES.items()}
    metric_curves(panels, png, spec.name, stage_boundaries(rows), FORMATS, PERCENT_CURVES, CAPTIONS)
    header = (
        f"# {spec.name}\n\n{spec.description.strip()}\n\n"
        "Best test accuracy (the papers' metric), in %: mean ± standard deviation over seeds "
        "(np.std, ddof=0; no "
        f"± for one seed), n = the number of seeds. Generated {date.today()} by `fedhet report` "
        f"from runs computed in:\n\n{environments(rows)}\n\n"
    )
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
            + markdown_table(rows, "rounds_to_target", _rounds)
        )
    rows = with_rounds_to_reference(rows, reference)
    sections.append(
        f"## Rounds to {reference}'s best accuracy\n\nRounds until the test accuracy first "
        f"reaches {reference}'s mean best accuracy (over seeds) in the same setting; mean over "
        "the seeds that reached it (k/n: k of the cell's n seeds did).\n\n"
        + markdown_table(rows, "rounds_to_reference", _rounds)
    )
    sections.append(paired_section(cells(rows), reference, target, floor))
    sections.append(plateau_section(cells(rows), reference))
    rotated = any(run.spec.partition.rotation is not None for run in runs)
    if spec.eval.client_test is not None or rotated:
        rows = with_final_scores(rows, runs, store, console)
    if rotated:
        sections.append(own_angle_section(rows))
    if spec.eval.client_test is not None:
        sections.append(client_test_section(rows))
    sections += [
        "## Cost per round\n\nMeans over rounds and seeds; wall time includes evaluation rounds "
        "and leaves out each run's first round (it holds one-off warm-up: imports, first "
        "allocations), and x first is it relative to the setting's first algorithm; a round "
        "trip is one server-client exchange.\n\n" + cost_table(rows),
        "## Seconds per stage\n\nMean over seeds of the time each stored stage took to compute "
        "(a resumed stage: its last attempt; a stage shared by several runs counts in each).\n\n"
        + stage_table(rows),
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
    figures = ", ".join(str(md.with_suffix(f".{fmt}")) for fmt in FORMATS)
    return (
        f"{head.rstrip()}\n\nThe full report, {md}, also has: " + "; ".join(titles) + "."
        f"\nCurves: {figures}"
    )
