"""The one entry point of every mode of `fedhet train`: the runs in order in this process, or
every node of every run scheduled on local worker processes (`jobs`) or Ray tasks (`ray`)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from fedhet.core import divergence
from fedhet.core.errors import DivergedError, FedhetError, RunError
from fedhet.core.pipeline import ProgressSink
from fedhet.core.store import ArtifactStore
from fedhet.execution.planning import Run
from fedhet.execution.results import execute, failed_row, result_row, stored_metrics
from fedhet.execution.scheduler import BLOCKED, FAILED, Listener, NodeState
from fedhet.execution.sweep import check_writable, executor_for, sweep
from fedhet.process import cores

Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class Options:
    jobs: int | None = None  # local worker processes
    ray: str | None = None  # "local" (a Ray started here) or a cluster's address
    retry_diverged: bool = False  # compute again the nodes whose divergence is recorded

    @property
    def in_order(self) -> bool:
        return self.jobs is None and self.ray is None


class View(AbstractContextManager, Protocol):
    """Where a sweep shows what happens: node state changes and the rounds workers report."""

    on_change: Listener
    on_progress: ProgressSink


def train(
    runs: list[Run], store: ArtifactStore, options: Options, view: View
) -> tuple[Rows, list[FedhetError]]:
    """Compute what every run is missing; a row per run (a failed run's says how it failed)
    and the failures, in run order. The view shows a sweep; runs trained in order (no jobs,
    no Ray) print their own progress. A node that diverged when it last ran fails with that
    divergence unless `options.retry_diverged`."""
    if options.retry_diverged:
        _forget_divergences(runs, store)
    if options.in_order:
        return _in_order(runs, store)
    return _sweep(runs, store, options, view)


def _forget_divergences(runs: list[Run], store: ArtifactStore) -> None:
    for node in {node.key: node for run in runs for node in run.node.walk()}.values():
        divergence.forget(store.partial_dir(node.stage, node.key))


def _in_order(runs: list[Run], store: ArtifactStore) -> tuple[Rows, list[FedhetError]]:
    rows, failures = [], []
    for run in runs:
        try:
            rows.append(result_row(run, stored_metrics(execute(run, store))))
        except DivergedError as error:
            failures.append(error)
            rows.append(failed_row(run, error))
    return rows, failures


def _sweep(
    runs: list[Run], store: ArtifactStore, options: Options, view: View
) -> tuple[Rows, list[FedhetError]]:
    check_writable(store)
    jobs = options.jobs or 1
    threads = runs[0].spec.runtime.threads or cores.default_threads(jobs)
    executor = executor_for(runs, options.jobs, options.ray, threads, view.on_progress)
    try:
        with view:
            states = sweep(runs, store, executor, view.on_change)
    finally:  # e.g. a local Ray started for this command ends with it
        executor.close(cancel=True)
    rows, failures = [], []
    for run in runs:
        error = _failure(run, states)
        if error is None:
            group = store.open(run.node.stage, run.node.key)
            rows.append(result_row(run, stored_metrics(group)))
            continue
        failures.append(error)
        rows.append(failed_row(run, error))
    return rows, failures


def _failure(run: Run, states: dict[str, NodeState]) -> FedhetError | None:
    """Why the run has no result (the first of its nodes that failed or was blocked), else None."""
    mine = [states[node.key] for node in run.node.walk()]
    failed = next((n for n in mine if n.state in (FAILED, BLOCKED)), None)
    if failed is None:
        return None
    error = failed.error
    if not isinstance(error, FedhetError):
        why = f"{failed.state}: {type(error).__name__}: {error}" if error else failed.state
        error = RunError(f"{run.label} ({failed.task.node.stage}) {why}")
    return error
