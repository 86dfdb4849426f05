"""The report's personalized section (`eval.client_test`): each client's own model scored on its
own test split, summarized over the clients, beside the method's global model on the test set;
the differences with the reference algorithm, paired over seeds; and a figure of both.

Over the K clients of a run (fedhet.metrics.accuracy.client_spread; a client never sampled is
counted, scored with the model it holds before training; a client without test samples has no
accuracy and is left out):
- weighted mean: the clients' accuracies weighted by their training samples;
- mean: every client counts once;
- worst 10%: the mean of the ceil(K / 10) lowest accuracies (K = 20: the lowest 2);
- std: their standard deviation (np.std, ddof=0).
The global model's accuracy is `fedhet eval`'s `global_accuracy`: the method's global model on
the test set, none for a method whose clients alone hold some of its layers (FedPer, LG-FedAvg,
FedRep, FedBN, SiloBN, Local). A run's values are its final model's (`fedhet eval`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from fedhet.core import units
from fedhet.figures import FORMATS, save
from fedhet.metrics.paired import CONFIDENCE
from fedhet.reports.comparison import (
    DIVERGED,
    NOT_EVALUATED,
    PairedMetric,
    Rounds,
    compared,
    paired_table,
)

Cells = Mapping[tuple[str, str], list[dict]]  # (algorithm, setting) -> its runs' report rows

# `fedhet eval`'s fields the section shows (stored as fractions), and their columns
SCORES = {
    "client_test_weighted_mean": "weighted mean (%)",
    "client_test_mean": "mean (%)",
    "client_test_worst_decile": "worst 10% (%)",
    "client_test_std": "std over clients (%)",
    "global_accuracy": "global model (%)",
}
PAIRED = {  # the fields compared with the reference, and their titles
    "client_test_weighted_mean": "Personalized accuracy, weighted mean over clients",
    "client_test_mean": "Personalized accuracy, mean over clients",
    "client_test_worst_decile": "Personalized accuracy, worst 10% of clients",
    "global_accuracy": "Global model's test accuracy",
}
NO_GLOBAL_MODEL = "no global model"
BARS = ("client_test_weighted_mean", "client_test_mean", "client_test_worst_decile")


def paired_metrics() -> list[PairedMetric]:
    return [PairedMetric(title, _final(name)) for name, title in PAIRED.items()]


def _final(name: str) -> Callable[[dict, Rounds], float | str]:
    """A final model's score: none for a diverged run, or for a method that does not have it."""

    def value(row: dict, rounds: Rounds) -> float | str:
        if row["diverged"] is not None:
            return DIVERGED
        if math.isnan(row[name]):
            return NO_GLOBAL_MODEL if name == "global_accuracy" else NOT_EVALUATED
        return row[name]

    return value


def section(
    cells: Cells,
    reference: str,
    floor: float,
    summary: Callable[[list[float]], str],
    figure: Path,
    early: Collection[tuple[str, str]] = (),
) -> str:
    """The section's markdown: a table per setting (each cell `summary` of the runs' values,
    over seeds), the paired tables against `reference` (`floor`: the smallest difference, as a
    fraction, a verdict calls a gain; a verdict of a pair in `early` marked early training, as
    the report's) and the figure, written as `figure` in every format."""
    settings = list(dict.fromkeys(setting for _, setting in cells))
    tables = [f"### {setting}\n\n" + _table(cells, setting, summary) for setting in settings]
    paired = [
        f"#### {metric.title}\n\n" + paired_table(rows, metric.unit, early)
        for metric in paired_metrics()
        if (rows := compared(cells, reference, metric, floor))
    ]
    save(_figure(cells, settings), figure, FORMATS)
    intro = (
        "## Personalized accuracy\n\nEach client scored on its own test split (drawn from the "
        "test split in its training label proportions) with its own final model: the model it "
        "uses (its own layers or BN entries, its personal model, its fine-tuned model, ...; "
        "the global model for a method that personalizes nothing). Every client counts: one "
        "never sampled is scored with the model it holds before training; a client without test "
        "samples is left out. Over a run's K clients: the mean weighted by the clients' "
        "training samples, the unweighted mean, the worst 10% (the mean of the ceil(K/10) "
        "lowest accuracies) and the standard deviation (ddof=0); beside them the global "
        "model's accuracy on the test set (- for a method without one: FedPer, LG-FedAvg, "
        "FedRep, FedBN, SiloBN, Local). Over the seeds: mean ± std (%) of each run's figure."
    )
    comparison = (
        f"### Paired differences against {reference}\n\nEach figure above, every other "
        f"algorithm minus {reference}, run by run over the seeds both have: mean difference "
        f"(points), its {100 * CONFIDENCE:.0f}% Student t interval and the verdict, as in the "
        "paired differences above."
    )
    if not paired:
        paired = [f"No other algorithm ran in a setting of {reference}'s: nothing to compare."]
    return "\n\n".join(
        [intro, *tables, comparison, *paired, f"![personalized accuracy]({figure.name})\n"]
    )


def _table(cells: Cells, setting: str, summary: Callable[[list[float]], str]) -> str:
    lines = [
        "| algorithm | " + " | ".join(SCORES.values()) + " |",
        "|---" * (len(SCORES) + 1) + "|",
    ]
    for (algorithm, where), runs in cells.items():
        if where == setting:
            texts = [_summary([r[name] for r in runs], summary) for name in SCORES]
            lines.append(f"| {algorithm} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def _summary(values: list[float], summary: Callable[[list[float]], str]) -> str:
    return "-" if all(math.isnan(v) for v in values) else summary(values)


def _figure(cells: Cells, settings: list[str]) -> Figure:
    """One panel per setting: each algorithm's personalized accuracies (bars) and its global
    model's (a diamond), mean over seeds with ± one std."""
    algorithms = list(dict.fromkeys(algorithm for algorithm, _ in cells))
    fig = Figure(
        figsize=(4.8 * len(settings) + 2.4, 0.45 * len(algorithms) + 1.6), layout="constrained"
    )
    axes = fig.subplots(1, len(settings), squeeze=False, sharey=True)
    positions = np.arange(len(algorithms))
    height = 0.8 / len(BARS)
    for ax, setting in zip(axes[0], settings, strict=True):
        for i, name in enumerate(BARS):
            mean, std = _over_seeds(cells, algorithms, setting, name)
            offset = (i - (len(BARS) - 1) / 2) * height
            ax.barh(positions + offset, mean, height, xerr=std, label=SCORES[name], capsize=2)
        mean, std = _over_seeds(cells, algorithms, setting, "global_accuracy")
        ax.errorbar(mean, positions, xerr=std, fmt="kD", label=SCORES["global_accuracy"])
        ax.set_title(setting)
        ax.set_xlabel("accuracy (%)")
        ax.set_xlim(0, 100)
    axes[0][0].set_yticks(positions, algorithms)
    axes[0][0].invert_yaxis()
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize=8, frameon=False)
    fig.supxlabel(
        "Bars: each client's own model on its own test split, over the clients; diamond: the "
        "global model on the test set; each the mean ± std over seeds",
        fontsize=8,
    )
    return fig


def _over_seeds(
    cells: Cells, algorithms: list[str], setting: str, name: str
) -> tuple[np.ndarray, np.ndarray]:
    """The mean and std (%) over each algorithm's seeds of `name`; NaN where not measured."""
    mean, std = [], []
    for algorithm in algorithms:
        values = np.asarray([r[name] for r in cells.get((algorithm, setting), [])], dtype=float)
        values = units.percent(values[~np.isnan(values)])
        mean.append(values.mean() if values.size else math.nan)
        std.append(values.std() if values.size else math.nan)
    return np.asarray(mean), np.asarray(std)


def run_rows(rows: list[dict]) -> list[dict]:
    """A row per run of the report rows (with their final scores): labels, seed, key, the round
    it diverged in (None) and the section's values, stored as fractions."""
    labels = ("algorithm", "setting", "seed", "key", "diverged")
    return [{name: row[name] for name in (*labels, *SCORES)} for row in rows]
