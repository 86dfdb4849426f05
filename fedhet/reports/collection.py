"""A report's rows: one per stored run, with its metrics, stage times, environment and, where
the report asks, the scores of its final model."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
from rich.console import Console

from fedhet.core import provenance
from fedhet.core.store import ArtifactStore
from fedhet.execution.planning import Run
from fedhet.execution.results import outcome, result_row
from fedhet.reports.evaluation import evaluate_run

FINAL_METRICS = ("own_angle", "client_test_mean", "client_test_worst_decile", "client_test_std")


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


def environments(rows: list[dict]) -> str:
    """The distinct environments the rows were computed in, with how many runs each."""
    counts = Counter(
        "not stored (diverged)"
        if r["diverged"] is not None
        else provenance.summary(r["environment"])
        for r in rows
    )
    return "\n".join(f"- {env}: {n} run{'s' if n != 1 else ''}" for env, n in counts.most_common())
