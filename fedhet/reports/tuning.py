"""How a tune chose, for `fedhet tune`'s tables and a tuned report's section: per method and
setting, what was searched, with what budget, the configuration chosen, and how sensitive the
method was to its hyperparameters (the best trial's validation score against the median's)."""

from __future__ import annotations

import math
from typing import Any

from fedhet.core.tune_spec import TuneSpec
from fedhet.tuning.groups import values_label
from fedhet.tuning.outcome import TuneOutcome

METRICS = {
    "best_val": "the best validation accuracy of each run",
    "final_val": "the last evaluated validation accuracy of each run",
}


def selection_rows(outcome: TuneOutcome) -> list[dict[str, Any]]:
    """A row per method and setting: its search and its choice."""
    return [
        {
            "algorithm": s.algorithm,
            "setting": s.setting,
            "sampler": s.sampler,
            "space": "; ".join(f"{path} {values}" for path, values in s.space.items()),
            "trials": len(s.trials),
            "pruned": s.pruned or None,  # a column only when some trial stopped early
            "chosen": values_label(s.values),
            "best_val": s.best,
            "median_val": s.median,
            "spread": s.best - s.median,
        }
        for s in outcome.selections
    ]


def trial_rows(outcome: TuneOutcome) -> list[dict[str, Any]]:
    """A row per trial, with its score per selection seed and its runs' keys."""
    return [
        {
            "algorithm": s.algorithm,
            "setting": s.setting,
            "trial": trial.number,
            "values": values_label(trial.values),
            "val_score": trial.score,
            "scores": " ".join("-" if v is None else f"{100 * v:.2f}" for v in trial.scores),
            "pruned_at": trial.pruned_at,
            "chosen": "yes" if index == s.chosen else "",
            "keys": " ".join(key[:10] for key in trial.keys),
        }
        for s in outcome.selections
        for index, trial in enumerate(s.trials)
    ]


def tuning_section(outcome: TuneOutcome, tune: TuneSpec) -> str:
    """The report's account of the tune its runs come from."""
    unequal = tune.unequal_budgets()
    budget = f"{tune.trials} trials per method, the same for every method"
    if unequal:
        own = ", ".join(f"{method} {trials}" for method, trials in unequal.items())
        budget = f"{tune.trials} trials per method, except by the spec's choice: {own}"
    lines = [
        "| algorithm | setting | sampler | searched | trials | stopped early | chosen "
        "| best val % | median val % | best - median (points) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in selection_rows(outcome):
        lines.append(
            f"| {row['algorithm']} | {row['setting']} | {row['sampler']} | {row['space']} "
            f"| {row['trials']} | {row['pruned'] or 0} | {row['chosen']} | {_pct(row['best_val'])} "
            f"| {_pct(row['median_val'])} | {_pct(row['spread'])} |"
        )
    stopping = "No trial was stopped early."
    if tune.prune is not None:
        stopping = (
            f"A trial could stop at rounds {', '.join(map(str, tune.prune.rungs))} (Optuna's "
            f"MedianPruner, once {tune.prune.startup_trials} trials had completed); the median "
            "is over the trials that ran all their rounds."
        )
    return (
        f"## Tuning\n\nEvery method runs the configuration `fedhet tune` chose (tune "
        f"{outcome.key[:12]}) on the validation split alone: {METRICS[outcome.metric]}, averaged "
        f"over the selection seeds {', '.join(map(str, outcome.seeds))}; no test result entered "
        f"a choice. Budget: {budget}. {stopping} A large best - median spread says the "
        "method's result depends on its tuning.\n\n" + "\n".join(lines)
    )


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.2f}"
