"""A run's result: computed in this process, or read from the store (its divergence too), and
summarized as one row."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedhet.core import divergence
from fedhet.core.errors import DivergedError, FedhetError, InputError
from fedhet.core.pipeline import RunContext, ensure
from fedhet.core.store import ArtifactStore
from fedhet.engine import tensorboard
from fedhet.execution.planning import Run
from fedhet.metrics.summary import summarize

if TYPE_CHECKING:
    import zarr


def execute(run: Run, store: ArtifactStore) -> zarr.Group:
    if run.spec.runtime.tensorboard is not None:  # before anything is computed
        tensorboard.check_folder(run.spec.runtime.tensorboard, "runtime.tensorboard")
    context = RunContext(run.spec, store, labels=run.node_labels(), run_name=run.label)
    return ensure(run.node, context)


def result(run: Run, store: ArtifactStore, train: bool) -> zarr.Group:
    """The run's final artifact, computed (with whatever it needs) only when `train`. Raises
    the run's DivergedError when it diverged: without `train`, the one recorded in its stage's
    partial folder (fedhet.core.divergence), so that readers report it without training."""
    if train:
        return execute(run, store)
    if not store.exists(run.node.stage, run.node.key):
        diverged = stored_divergence(run, store)
        if diverged is not None:
            raise diverged
    return store.open(run.node.stage, run.node.key)


@dataclass(frozen=True)
class Outcome:
    """What a run came to: its final artifact, or the divergence that ended it."""

    group: zarr.Group | None
    diverged: DivergedError | None = None

    @property
    def metrics(self) -> dict[str, list[float]]:
        """Its per-round metrics (a diverged run's: the rounds before its divergence)."""
        return self.diverged.metrics if self.diverged is not None else stored_metrics(self.group)

    @property
    def diverged_round(self) -> int | None:
        return None if self.diverged is None else self.diverged.round_number


def outcome(run: Run, store: ArtifactStore, train: bool) -> Outcome:
    """The run's `result`, a divergence included."""
    try:
        return Outcome(result(run, store, train))
    except DivergedError as error:
        return Outcome(None, error)


def stored_divergence(run: Run, store: ArtifactStore) -> DivergedError | None:
    """The divergence recorded when the run's stage last ran, or when one of the stages it is
    built on did (TCT's stage 1: its eNTK and stage 2 then never run), as the run's (see
    `run_divergence`), else None. A stage stored since (by another machine) has no say."""
    for node in reversed(run.node.walk()):
        if store.path(node.stage, node.key).joinpath("zarr.json").exists():
            continue
        diverged = divergence.recorded(store.partial_dir(node.stage, node.key))
        if diverged is not None:
            return run_divergence(run, diverged)
    return None


def run_divergence(run: Run, error: DivergedError) -> DivergedError:
    """`error` as the run's result: when a stage the run is built on diverged, that stage's
    model is not the run's, so of its rounds only the costs count (as TCT's stage 2 counts its
    stage 1's), every other metric NaN."""
    if error.key in (None, run.node.key):
        return error
    # imported here: run_format imports zarr, which `plan` and `runs` do without
    from fedhet.engine.run_format import COST_METRICS

    metrics = {
        name: values if name in COST_METRICS else [math.nan] * len(values)
        for name, values in error.metrics.items()
    }
    return DivergedError(str(error), error.round_number, metrics, error.key)


def require_stored(runs: list[Run], store: ArtifactStore, remedy: str, shown: int = 5) -> None:
    """Raise InputError, in one line naming them and ending with `remedy` (how to store them, in
    the caller's words: a command line, a Python call), when some runs' results are not in the
    store (a run that diverged has its result: the divergence): commands that read results
    (eval, report) train only when asked to."""
    missing = [
        run
        for run in runs
        if not store.exists(run.node.stage, run.node.key) and not stored_divergence(run, store)
    ]
    if not missing:
        return
    names = [_missing_name(run, store) for run in missing[:shown]]
    if len(missing) > shown:
        names.append(f"{len(missing) - shown} more")
    raise InputError(
        f"{len(missing)} of {len(runs)} runs are not stored ({'; '.join(names)}); {remedy}"
    )


def _missing_name(run: Run, store: ArtifactStore) -> str:
    node = run.node
    kept = ", checkpoint kept" if store.partial_dir(node.stage, node.key).exists() else ""
    return f"{run.label} ({node.stage} {node.key[:12]}{kept})"


def stored_metrics(group: zarr.Group) -> dict[str, list[float]]:
    return {name: arr[:].tolist() for name, arr in group["metrics"].arrays()}


def result_row(run: Run, metrics: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    summary = summarize(metrics, run.spec.eval.target_accuracy)
    return {
        "algorithm": run.algorithm_label,
        "setting": run.setting_label,
        "seed": run.spec.seed,
        **summary,
    }


def failed_row(run: Run, error: FedhetError) -> dict[str, Any]:
    """The row of a run that failed: what it completed before it diverged, or only `failed`."""
    if not isinstance(error, DivergedError):
        return {
            "algorithm": run.algorithm_label,
            "setting": run.setting_label,
            "seed": run.spec.seed,
            "final": "failed",
        }
    failed = f"diverged {error.round_number}/{run.spec.federation.rounds}"
    return {**result_row(run, run_divergence(run, error).metrics), "final": failed}
