"""The work behind every command and every `fedhet.Experiment` method, done once: a checked spec
over an artifact store, its runs trained, planned, tuned, read, evaluated and reported, as rows
of stored quantities (accuracies as fractions of 1). The command line (fedhet.cli) prints them as
tables, the Python API (fedhet.api) returns them as DataFrames; both open a session through
`open_session`, so both refuse the same inputs with the same one-line messages, worded in the
caller's `Voice` (command-line options, or Python arguments). A session is a spec session
(fedhet.spec_session: the spec's runs, its filled-in form and keys) over a store.

Light to import: what computes (torch, the reports) is imported when a method runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from rich.console import Console

from fedhet.core import units
from fedhet.core.errors import InputError
from fedhet.core.sealed import damage_named
from fedhet.core.spec import Spec
from fedhet.core.store import ArtifactStore
from fedhet.core.tune_spec import TuneSpec
from fedhet.execution.caller import QuietView, Recomputer, Voice
from fedhet.spec_session import Rows, SpecSession, checked, located

if TYPE_CHECKING:
    from fedhet.core.errors import FedhetError
    from fedhet.core.pipeline import StageNode
    from fedhet.data.partition import Partition
    from fedhet.execution.planning import Run
    from fedhet.execution.train import View
    from fedhet.reports.export import StoredRun
    from fedhet.tuning.outcome import TuneOutcome

S = TypeVar("S", bound="Session")
ModelChoice = Literal["final", "best"]


@dataclass
class Session(SpecSession):
    """A spec session (the checked spec, the `voice` its messages are worded in, the `console`
    that hears progress notes) over a store; `view` shows a sweep of runs
    (fedhet.execution.train.View)."""

    store: ArtifactStore
    view: Callable[[list[Run]], View] = QuietView

    def train_rows(
        self,
        jobs: int | None = None,
        ray: str | None = None,
        retry_diverged: bool = False,
        runs: list[Run] | None = None,
    ) -> tuple[Rows, list[FedhetError]]:
        """Compute what every run (or `runs`) is missing, in order here, on `jobs` worker
        processes or on Ray (`ray`: "local" or a cluster's address); a result row per run (a
        failed run's says how) and the failures, in run order."""
        from fedhet.execution.train import Options, train

        self._check_sweep(jobs, ray)
        runs = self.planned if runs is None else runs
        return train(runs, self.store, Options(jobs, ray, retry_diverged), self.view(runs))

    def run_rows(self, algorithm: str | None = None, state: str | None = None) -> Rows:
        """A row per run as far as the store has it (labels, seed, key, state, best and final
        test accuracy, rounds, wall time; a damaged run's checksums fail, as the plan checks
        them: one line says how to recompute it); only `algorithm`'s runs (its label, or one in
        the style of labels before), or those in `state`."""
        from fedhet.execution.labels import named_label
        from fedhet.reports.status import run_row

        damage: dict[str, tuple] = {}  # told only for the runs listed
        rows = [
            run_row(run, self.store, lambda *told: damage.setdefault(told[1], told))
            | {"key": run.node.key}
            for run in self.planned
        ]
        if algorithm is not None:
            algorithm = named_label(algorithm, [row["algorithm"] for row in rows]) or algorithm
        listed = [
            row
            for row in rows
            if algorithm in (None, row["algorithm"]) and state in (None, row["state"])
        ]
        for row in listed:
            if row["key"] in damage:
                self._damaged("train", *damage[row["key"]])
        return listed

    def plan_rows(self, tune: bool = False) -> tuple[Rows, str]:
        """Every run's stages and their state (stored, diverged, blocked, partial, missing, with
        the time left where known, or damaged: one line each says how to recompute it), and a
        one-line summary; with `tune`, the runs of the tune's trials as far as the stored results
        decide them, and the tune's outcome as its own row."""
        from fedhet.reports.status import plan_rows

        if not tune:
            return plan_rows(self.planned, self.store, partial(self._damaged, "train"))
        rows, summary, unasked = self._tune_plan()
        if unasked:
            summary += f"; {unasked} more trials, sampled once these are stored"
        return rows, summary

    def _tune_plan(self) -> tuple[Rows, str, int]:
        """The plan's rows of the tune's trials and of its outcome; the summary; the trials
        still to be asked."""
        from fedhet.reports.status import outcome_row, plan_rows, summary
        from fedhet.tuning.runner import outcome_key, planned_trials

        section, damaged = self.tune_section(), partial(self._damaged, "tune")
        runs, unasked = planned_trials(self.spec, section, self.store)
        rows, _ = plan_rows(runs, self.store, damaged)
        key = outcome_key(self.spec, section)
        rows.append(outcome_row(f"tune of {self.spec.name}", "tune", key, self.store, damaged))
        return rows, summary(rows), unasked

    def _damaged(self, command: Recomputer, stage: str, key: str, why: str) -> None:
        """Say that the stored `stage/key` is damaged (`why`), and that `command` recomputes it
        once removed."""
        cascade = bool(self.store.dependents({key}))
        self.console.print(
            f"warning: {stage}/{key[:12]} is damaged: {why} (`fedhet artifacts verify`); "
            f"{self.voice.recompute(key[:12], cascade, command)}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )

    def partitions(self) -> Iterator[tuple[StageNode, str, Partition]]:
        """Each distinct partition of the runs, its node and label, in run order; each computed
        (or read from the store) when the iteration reaches it."""
        from fedhet.execution.partitions import partitions

        return partitions(self.planned, self.store, self.console)

    def tune_outcome(self, jobs: int | None = None) -> TuneOutcome:
        """Select each method's hyperparameters as the spec's `tune:` section says, its missing
        trials trained first (in `jobs` worker processes); the stored outcome."""
        from fedhet.execution.train import Options
        from fedhet.tuning.runner import tune

        section = self.tune_section()
        self._check_sweep(jobs)
        return tune(self.spec, section, self.store, Options(jobs), self.view, self.console)

    def evaluations(self, model: ModelChoice = "final", cgv: bool = False, train: bool = False):
        """Global, per-class and per-client accuracy of each run's final (or best) model (and
        with `cgv` its client gradient variance); a diverged run's says so, with no scores."""
        if model not in ("final", "best"):
            raise InputError(f"{self.voice.setting('model', model)}: give 'final' or 'best'")
        from fedhet.execution.results import outcome
        from fedhet.reports.evaluation import evaluate_outcome

        self.require_stored(train, "evaluate")
        return [
            evaluate_outcome(
                run, outcome(run, self.store, train), self.store, cgv, model, self.console
            )
            for run in self.planned
        ]

    def histories(self, train: bool = False, tensorboard: Path | None = None) -> list[StoredRun]:
        """Each run's per-round metrics (of the rounds before a divergence); with `tensorboard`,
        also written there as TensorBoard events, a folder per run."""
        from fedhet.engine.tensorboard import check_folder
        from fedhet.reports import export

        if tensorboard is not None:
            check_folder(tensorboard, self.voice.option("tensorboard"))
        self.require_stored(train, "metrics")
        stored = export.collect(self.planned, self.store, train)
        if tensorboard is not None:
            export.write_tensorboard(stored, tensorboard)
        return stored

    def metric_rows(self, train: bool = False, tensorboard: Path | None = None) -> Rows:
        """A row per run and round: `fedhet export`'s columns, accuracies in percent (with
        `tensorboard`, as `histories`)."""
        from fedhet.reports import export

        return export.long_rows(self.histories(train, tensorboard))

    def paired_rows(
        self, baseline: str | None = None, train: bool = False, floor: float | None = None
    ) -> Rows:
        """The report's paired differences of every algorithm with `baseline` (default the
        matrix's first), a row per metric and setting, in the metric's unit; `floor`: the
        smallest difference in accuracy, in points (default 0.5), a verdict calls a gain."""
        from fedhet.metrics.summary import validated
        from fedhet.reports import comparison, personalized, plateau, report

        reference = self._reference(baseline)
        minimum = _fraction(floor, comparison.FLOOR_POINTS)  # refused before anything trains
        self.require_stored(train, "compare")
        rows = self.final_rows(train)
        cells = report.cells(rows)
        metrics = comparison.paired_metrics(self.spec.eval.target_accuracy, validated(rows))
        if self.spec.eval.client_test is not None:
            metrics += personalized.paired_metrics()
        early = plateau.early_pairs(cells, reference)
        return [
            _paired_row(metric, row, reference, (row.algorithm, row.setting) in early)
            for metric in metrics
            for row in comparison.compared(cells, reference, metric, minimum)
        ]

    def personalized_rows(self, train: bool = False) -> Rows:
        """With `eval.client_test`, a row per run: its clients' own final models on their own
        test splits (weighted mean, mean, worst 10%, spread) and the global model's accuracy;
        InputError without it."""
        from fedhet.reports import personalized

        if self.spec.eval.client_test is None:
            raise InputError(
                f"{self.where}: personalized accuracy needs eval.client_test; set it (e.g. "
                "eval.client_test.per_client=100) to score each client on its own test set"
            )
        self.require_stored(train, "personalized")
        return personalized.run_rows(self.final_rows(train))

    def final_rows(self, train: bool) -> Rows:
        """The report's rows, with their final models' scores under `eval.client_test`."""
        from fedhet.reports import report

        console = Console(stderr=True, quiet=True)
        rows = report.collect(self.planned, self.store, console, train)
        if self.spec.eval.client_test is None:
            return rows
        return report.with_final_scores(rows, self.planned, self.store, console)

    @damage_named()
    def report(
        self,
        out: str | Path | None = None,
        baseline: str | None = None,
        train: bool = False,
        floor: float | None = None,
        tuned: bool = False,
        jobs: int | None = None,
    ) -> Path:
        """Write what `fedhet report` writes into the folder `out` (by default `report/` of the
        working directory), pairing every algorithm with `baseline` (default the first);
        `floor` in points (default 0.5), as `compare`'s; with `tuned`, the configurations the
        tune chose (into NAME_tuned.md); with `train` and `jobs`, the missing runs computed
        first on worker processes. The markdown file's path."""
        from fedhet.reports.comparison import FLOOR_POINTS
        from fedhet.reports.report import DEFAULT_FOLDER, write_report

        spec, runs, section = self.spec, self.planned, None
        baseline = self._reference(baseline)  # one in the style of labels before: today's
        floor = _fraction(floor, FLOOR_POINTS)  # refused before anything trains
        if tuned:
            spec, runs, section = self._tuned_runs(train)
        else:
            self.require_stored(train, "report")
        if train and jobs is not None:  # in parallel first; a failed run is a row of the report
            self.train_rows(jobs, runs=runs)
        named = {"baseline": baseline, "floor": floor, "tuning": section}
        folder = DEFAULT_FOLDER if out is None else Path(out)
        return write_report(spec, runs, self.store, folder, self.console, train, **named)[0]

    def _reference(self, baseline: str | None) -> str:
        """The algorithm label the others are paired with: `baseline`, else the first."""
        from fedhet.reports.report import reference_algorithm

        given = self.voice.setting("baseline", baseline)
        return reference_algorithm(self.planned, baseline, self.console, given)

    def _tuned_runs(self, train: bool) -> tuple[Spec, list[Run], str]:
        """The spec renamed NAME_tuned, the runs of its tune's chosen configurations (stored,
        unless `train`), and the report's section on the tune."""
        from fedhet.reports.tuning import tuning_section
        from fedhet.tuning.runner import require_tuned_stored, tuned_runs

        section = self.tune_section()
        runs, outcome = tuned_runs(
            self.spec, section, self.store, str(self.where), self.voice.tune_first()
        )
        if not train:
            require_tuned_stored(runs, self.store, self.voice.train_tuned())
        renamed = self.spec.model_copy(update={"name": f"{self.spec.name}_tuned"})
        return renamed, runs, tuning_section(outcome, section)

    def tune_section(self) -> TuneSpec:
        """The spec's `tune:` section; InputError when it has none."""
        if self.spec.tune is None:
            raise InputError(
                f"{self.where}: no tune section; add one, e.g. tune: {{trials: 4, seeds: [100], "
                "space: {federation.lr: {grid: [0.02, 0.05, 0.1, 0.2]}}} (docs/how-to/tune.md)"
            )
        return self.spec.tune

    def require_stored(self, train: bool, reader: str) -> None:
        """InputError naming the runs not stored and how to store them, unless `train`."""
        from fedhet.execution.results import require_stored

        if not train:
            require_stored(self.planned, self.store, self.voice.train_first(reader))

    def _check_sweep(self, jobs: int | None, ray: str | None = None) -> None:
        """InputError, in the caller's words, for no worker process, or for a store that worker
        processes or Ray tasks cannot write."""
        if jobs is not None and jobs < 1:
            raise InputError(f"{self.voice.setting('jobs', jobs)}: give at least 1 worker process")
        if jobs is not None or ray is not None:
            from fedhet.execution.sweep import check_writable

            check_writable(self.store, self.voice.option("store"))


def open_session(
    source: str | Path | Mapping[str, Any],
    overrides: Sequence[str],
    voice: Voice,
    console: Console,
    store: str | Path | None = None,
    only: Sequence[str] = (),
    data_root: Path | None = None,
    note: Callable[[str], None] = lambda line: None,
    kind: type[S] = Session,
) -> S:
    """The session (a `kind` of Session) of a spec file (or a mapping) with `overrides`
    (PATH=VALUE) and `only` filters (AXIS=VALUE), over the store `store` (default: FEDHET_STORE
    or ./artifacts), its data read from `data_root` where given; InputError for a spec fedhet
    refuses. `note` hears one line per matrix axis an override replaces."""
    spec = checked(source, overrides, only, data_root, note)
    return kind(spec, located(source), voice, console, ArtifactStore(store))


def _fraction(points: float | None, default: float) -> float:
    """The floor, a difference of accuracies given in points, as one of stored fractions;
    refused below 0, as `fedhet report --floor` refuses it."""
    if points is not None and not points >= 0:
        raise InputError(f"floor={points!r}: the floor is a difference in points, at least 0")
    return units.fraction(default if points is None else points)


def _paired_row(metric: Any, row: Any, reference: str, early: bool) -> dict[str, Any]:
    """A paired comparison (fedhet.reports.comparison) as a row, its differences in the
    metric's unit; `early`: the row's curve or the reference's has not levelled off in the
    row's setting, so the verdict is early training's (the report's " (early training)" mark,
    which a row of too few seeds, having no verdict to qualify, does not get)."""
    from fedhet.reports.comparison import in_unit, marked

    c = row.comparison

    def shown(difference: float | None) -> float | None:
        return None if difference is None else in_unit(difference, metric.unit)

    return {
        "metric": metric.title,
        "unit": metric.unit,
        "algorithm": row.algorithm,
        "reference": reference,
        "setting": row.setting,
        "pairs": c.n,
        "mean_difference": shown(c.mean),
        "ci_low": shown(c.low),
        "ci_high": shown(c.high),
        "seeds_ahead": c.ahead,
        "verdict": c.verdict,
        "early_training": marked(c, early),
        "rounds": row.rounds,
        "differences": [shown(d) for d in row.pairing.differences],
    }
