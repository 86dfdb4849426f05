"""A server-distillation method's teachers against its result (FedDF): in each run, the
validation accuracy of the round's client ensemble, of the clients' plain average, and of the
model the server distilled from the ensemble into the average (the run's own validation
accuracy), each the mean over the rounds the run evaluated; then, over the seeds, whether the
ensemble knows more than the average and whether distillation keeps it."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from fedhet.metrics.paired import CONFIDENCE, compare
from fedhet.reports.tables import percent_cell

ENSEMBLE, AVERAGE, DISTILLED = "ensemble_val_accuracy", "average_val_accuracy", "val_accuracy"


def evaluated_means(metrics: Mapping[str, np.ndarray]) -> tuple[float, float, float]:
    """The run's (ensemble, average, distilled) validation accuracy, each the mean over the
    rounds whose distilled model was evaluated and whose ensemble and average were scored."""
    curves = [np.asarray(metrics[name], dtype=float) for name in (ENSEMBLE, AVERAGE, DISTILLED)]
    length = min(len(curve) for curve in curves)
    stacked = np.stack([curve[:length] for curve in curves])
    scored = ~np.isnan(stacked).any(axis=0)
    if not scored.any():
        return math.nan, math.nan, math.nan
    ensemble, average, distilled = stacked[:, scored].mean(axis=1)
    return float(ensemble), float(average), float(distilled)


def distillation_section(cells: Mapping[tuple[str, str], list[dict]], floor: float) -> str | None:
    """The section for every group whose runs log their ensemble's validation accuracy, the
    differences' verdicts calling a gain from `floor` (a fraction of accuracy) up; None when no
    group does."""
    lines = []
    for (algorithm, setting), group in cells.items():
        runs = [r for r in group if ENSEMBLE in r["metrics"] and DISTILLED in r["metrics"]]
        if not runs:
            continue
        ensemble, average, distilled = zip(
            *(evaluated_means(r["metrics"]) for r in runs), strict=True
        )
        gains = [
            _difference([e - a for e, a in zip(ensemble, average, strict=True)], floor),
            _difference([d - a for d, a in zip(distilled, average, strict=True)], floor),
        ]
        accuracies = [percent_cell(list(v)) for v in (ensemble, average, distilled)]
        lines.append(f"| {algorithm} | {setting} | " + " | ".join(accuracies + gains) + " |")
    if not lines:
        return None
    ci = f"{100 * CONFIDENCE:.0f}% CI"
    return (
        "## The clients' ensemble, their average and the distilled model\n\n"
        "Validation accuracy in %, in each run the mean over the rounds it evaluated: of the "
        "round's client ensemble (the teacher distilled from), of the clients' plain average "
        "(the student before distillation) and of the distilled model (the run's own); mean ± "
        "standard deviation over seeds. The differences, in points, are paired over the seeds: "
        f"mean [{ci}] (verdict, as in the paired differences above).\n\n"
        "| algorithm | setting | ensemble | average | distilled | ensemble - average "
        "| distilled - average |\n|---|---|---|---|---|---|---|\n" + "\n".join(lines)
    )


def _difference(differences: list[float], floor: float) -> str:
    """Mean difference in points, its interval and verdict (fedhet.metrics.paired.compare)."""
    measured = [d for d in differences if not math.isnan(d)]
    if not measured:
        return "-"
    result = compare(measured, floor=floor)
    interval = "" if result.low is None else f" [{100 * result.low:+.2f}, {100 * result.high:+.2f}]"
    return f"{100 * result.mean:+.2f}{interval} ({result.verdict})"
