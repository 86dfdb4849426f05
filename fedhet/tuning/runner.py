"""A spec's tune computed (`tune`: the trials' runs trained where missing, the outcome stored),
planned (`planned_trials`: the trials the store's results lead to, without training), or read
(`tuned_runs`: the chosen configurations over the spec's evaluation seeds, from the stored
outcome or, for a tune never stored whose trials all are, from those trials)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from rich.console import Console

from fedhet.core.errors import DivergedError, InputError
from fedhet.core.spec import Spec
from fedhet.core.store import ArtifactStore
from fedhet.core.tune_spec import TuneSpec
from fedhet.execution.planning import Run
from fedhet.execution.results import stored_divergence
from fedhet.execution.train import Options, View, train
from fedhet.tuning.choice import choose
from fedhet.tuning.groups import TuneGroup, tune_groups
from fedhet.tuning.outcome import (
    STAGE,
    TuneOutcome,
    outcome_of,
    read_outcome,
    tune_key,
    write_outcome,
)
from fedhet.tuning.selection import validation_curve

Curves = Mapping[str, list[float] | None]


def tune(
    spec: Spec,
    tune: TuneSpec,
    store: ArtifactStore,
    options: Options,
    view_for: Callable[[list[Run]], View],
    console: Console,
) -> TuneOutcome:
    """The stored outcome of the spec's tune, its missing trials trained first."""
    groups = tune_groups(spec, tune)
    key = tune_key(tune, groups)
    if store.exists(STAGE, key):
        console.print(f"tune {key[:12]}: reusing the stored artifact", style="dim")
        return read_outcome(store, key, spec.name)

    def measure(runs: list[Run]) -> Curves:
        return _trained(runs, store, options, view_for, console)

    outcome = outcome_of(key, tune, choose(groups, tune, measure)[0])
    write_outcome(store, outcome, spec, tune)
    return outcome


def _trained(
    runs: list[Run],
    store: ArtifactStore,
    options: Options,
    view_for: Callable[[list[Run]], View],
    console: Console,
) -> Curves:
    """The runs' validation curves, the missing runs trained first (a divergence is a result)."""
    unique = list({run.node.key: run for run in runs}.values())
    missing = [run for run in unique if not _done(run, store)]
    console.print(f"tune: {len(runs)} trial runs, {len(missing)} not stored", markup=False)
    if missing:  # no worker starts for a wave the store holds
        _, failures = train(missing, store, options, view_for(missing))
        failed = [error for error in failures if not isinstance(error, DivergedError)]
        if failed:
            raise failed[0]
    return {run.node.key: validation_curve(run, store) for run in unique}


def planned_trials(spec: Spec, tune: TuneSpec, store: ArtifactStore) -> tuple[list[Run], int]:
    """The runs of the trials that the stored results lead to (the waves up to the first with
    a run not stored; a grid's extension and a runoff once the results they follow are
    stored), and how many trials are still to be asked after them."""
    choices, _ = choose(tune_groups(spec, tune), tune, lambda runs: _read(runs, store))
    runs = [run for choice in choices for trial in choice.trials for run in trial.runs]
    asked = sum(len(choice.trials) for choice in choices)
    return runs, sum(choice.group.budget for choice in choices) - asked


def outcome_key(spec: Spec, tune: TuneSpec) -> str:
    """The key of the tune's stored outcome (stage `tune`)."""
    return tune_key(tune, tune_groups(spec, tune))


def _done(run: Run, store: ArtifactStore) -> bool:
    """Whether the run has its result: stored, or a recorded divergence."""
    stored = store.exists(run.node.stage, run.node.key)
    return stored or stored_divergence(run, store) is not None


def _read(runs: list[Run], store: ArtifactStore) -> Curves | None:
    if not all(_done(run, store) for run in runs):
        return None
    return {run.node.key: validation_curve(run, store) for run in runs}


def tuned_runs(
    spec: Spec, tune: TuneSpec, store: ArtifactStore, spec_path: str, remedy: str
) -> tuple[list[Run], TuneOutcome]:
    """The chosen configuration of every method and setting over the spec's own seeds (its
    evaluation runs), and the outcome they come from (InputError naming `spec_path` and ending
    with `remedy`, how to store it, when it is neither stored nor computable from stored
    trials)."""
    groups = tune_groups(spec, tune)
    outcome = _stored_outcome(groups, tune, store, spec_path, remedy)
    return [
        run
        for group, chosen in zip(groups, outcome.selections, strict=True)
        for run in group.tuned_runs(chosen.values)
    ], outcome


def _stored_outcome(
    groups: list[TuneGroup], tune: TuneSpec, store: ArtifactStore, spec_path: str, remedy: str
) -> TuneOutcome:
    """The tune's stored outcome; where it was never stored but the store holds every trial it
    needs (a tune of more rows ran: `--only` narrows a tune to fewer), the same outcome, as
    the tune would compute it, without storing it."""
    key = tune_key(tune, groups)
    if not store.exists(STAGE, key):
        choices, complete = choose(groups, tune, lambda runs: _read(runs, store))
        if complete:
            return outcome_of(key, tune, choices)
    return read_outcome(store, key, spec_path, remedy)


def require_tuned_stored(runs: list[Run], store: ArtifactStore, remedy: str) -> None:
    """InputError, in one line ending with `remedy` (how to compute them), when some runs of
    the chosen configurations have no result."""
    missing = [run for run in runs if not _done(run, store)]
    if missing:
        raise InputError(
            f"{len(missing)} of {len(runs)} runs of the chosen configurations are not stored "
            f"(the first: {missing[0].label}); {remedy}"
        )
