"""How a tune chose, for `fedhet tune`'s tables and a tuned report's section: per method and
setting, what was searched, with what budget, the configuration chosen, how sensitive the
method was to its hyperparameters (the best trial's validation score against the median's),
and where the choice lies at the edge of what was tried."""

from __future__ import annotations

import math
from typing import Any

from fedhet.core.tune_spec import TuneSpec
from fedhet.tuning.edges import Edge
from fedhet.tuning.groups import values_label
from fedhet.tuning.outcome import Selection, TuneOutcome

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
            "extended": _added(s) or None,
            "runoff": sum(bool(t.runoff_keys) for t in s.trials) or None,
            "edge": "; ".join(f"{values_label({e.path: e.value})} {e.side}" for e in s.edges)
            or None,
        }
        for s in outcome.selections
    ]


def edge_notes(outcome: TuneOutcome) -> list[str]:
    """A sentence per chosen value that is the lowest or highest of its field's values tried."""
    return [
        f"{_group(s)}: {values_label({edge.path: edge.value})} is the {edge.side} value tried: "
        f"the optimum may lie {'below' if edge.side == 'lowest' else 'above'}; {_advice(edge)}"
        for s in outcome.selections
        for edge in s.edges
    ]


def _advice(edge: Edge) -> str:
    if edge.kind != "grid":
        return "widen the range"
    if edge.stop is not None:
        return f"not extended further: {edge.stop}"
    return (
        "extend the grid (tune.extend_edges: N tunes again with the next value past it, up to "
        "N times; e.g. `fedhet tune SPEC tune.extend_edges=2`)"
    )


def _group(selection: Selection) -> str:
    setting = f" ({selection.setting})" if selection.setting else ""
    return f"{selection.algorithm}{setting}"


def _added(selection: Selection) -> str:
    """The values added past an edge: `lr=0.03, lr=0.1`."""
    return ", ".join(
        values_label({path: value})
        for path, values in selection.extended.items()
        for value in values
    )


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
            "runoff_score": trial.runoff_score,
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
        "| best val % | median val % | best - median (points) | at an edge |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in selection_rows(outcome):
        lines.append(
            f"| {row['algorithm']} | {row['setting']} | {row['sampler']} | {row['space']} "
            f"| {row['trials']} | {row['pruned'] or 0} | {row['chosen']} | {_pct(row['best_val'])} "
            f"| {_pct(row['median_val'])} | {_pct(row['spread'])} | {row['edge'] or '-'} |"
        )
    stopping = "No trial was stopped early."
    if tune.prune is not None:
        stopping = (
            f"A trial could stop at rounds {', '.join(map(str, tune.prune.rungs))} (Optuna's "
            f"MedianPruner, once {tune.prune.startup_trials} trials had completed); the median "
            "is over the trials that ran all their rounds."
        )
    steps = " ".join(filter(None, (_extension(outcome, tune), _runoff(outcome, tune))))
    return (
        f"## Tuning\n\nEvery method runs the configuration `fedhet tune` chose (tune "
        f"{outcome.key[:12]}) on the validation split alone: {METRICS[outcome.metric]}, averaged "
        f"over the selection seeds {', '.join(map(str, outcome.seeds))}; no test result entered "
        f"a choice. Budget: {budget}. {stopping} A large best - median spread says the "
        f"method's result depends on its tuning.{' ' + steps if steps else ''}\n\n"
        + "\n".join(lines)
        + "\n\n"
        + _edges_paragraph(outcome)
    )


def _extension(outcome: TuneOutcome, tune: TuneSpec) -> str:
    if not tune.extend_edges:
        return ""
    added = "; ".join(f"{_group(s)}: {_added(s)}" for s in outcome.selections if s.extended)
    return (
        "A grid whose choice was its lowest or highest value gained the next value past it and "
        f"was tuned again, up to {tune.extend_edges} times (tune.extend_edges); the values "
        f"added: {added or 'none'}."
    )


def _runoff(outcome: TuneOutcome, tune: TuneSpec) -> str:
    if tune.runoff is None:
        return ""
    runoffs = "; ".join(
        f"{_group(s)}: {sum(bool(t.runoff_keys) for t in s.trials)} trials, chose "
        f"{values_label(s.values)}"
        for s in outcome.selections
        if any(t.runoff_keys for t in s.trials)
    )
    return (
        f"The trials within {100 * tune.runoff.within:.2f} points of the best (or within the "
        "best trial's seed-to-seed standard deviation, when larger), at most "
        f"{tune.runoff.candidates}, also ran the seeds "
        f"{', '.join(map(str, tune.runoff.seeds))}, and the choice is the highest mean over all "
        f"their seeds; runoffs: {runoffs or 'none'}."
    )


def _edges_paragraph(outcome: TuneOutcome) -> str:
    notes = edge_notes(outcome)
    if not notes:
        return "No chosen value is the lowest or highest value its field was tried at."
    return "**At an edge of what was tried.**\n\n" + "\n".join(f"- {note}" for note in notes)


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.2f}"
