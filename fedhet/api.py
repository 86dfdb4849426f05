"""fedhet from Python, for notebooks: a spec's runs, their per-round metrics and their paired
comparisons as pandas DataFrames; training and reports as the command line does them.

    import fedhet

    experiment = fedhet.load("specs/quickstart.yaml", "federation.rounds=10", store="artifacts")
    experiment.train()               # what `fedhet train` does (jobs=2: two worker processes)
    experiment.runs()                # a row per run: labels, seed, key, state, best_test_pct,
                                     # test_at_best_val_pct (with a validation split), final_pct
    experiment.metrics()             # a row per run and round: the columns of `fedhet export`
    experiment.compare()             # paired differences against the first algorithm
    experiment.personalized()        # with eval.client_test: a row per run, each client's own
                                     # model on its own test split, and the global model
    experiment.report("report")      # what `fedhet report` writes

Accuracies are in percent, in columns named `..._pct`, as in every table of the command line;
differences of accuracies in percentage points (`unit` "points"), and so is `floor`
(fedhet.core.units). Nothing is trained unless asked (`train()`, or `train=True` where a reader
takes it). Failures are fedhet's own errors (fedhet.core.errors) with the command line's one-line
messages, naming the Python call instead of the command: reading a run that is not stored raises
InputError, reading a damaged artifact DamagedArtifactError.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console

from fedhet.core import units
from fedhet.core.errors import DivergedError, InputError
from fedhet.core.pipeline import ProgressSink
from fedhet.core.sealed import damage_named
from fedhet.core.spec import Spec
from fedhet.core.store import ArtifactStore
from fedhet.execution.loading import checked_spec
from fedhet.execution.planning import Run, runs_of
from fedhet.execution.results import require_stored
from fedhet.execution.train import Options
from fedhet.execution.train import train as train_runs
from fedhet.metrics.summary import validated
from fedhet.reports import comparison, export, personalized, report, status


def load(
    spec: str | Path | Mapping[str, Any], *overrides: str, store: str | Path | None = None
) -> Experiment:
    """The experiment of a spec file (or a spec as a mapping) with `overrides` (PATH=VALUE, as on
    the command line) over the artifact store `store`, a folder or `s3://BUCKET/PREFIX` (default:
    FEDHET_STORE or ./artifacts); InputError, with `fedhet spec validate`'s message, for a spec
    the command line refuses."""
    parsed = checked_spec(spec, overrides)  # the command line's checks, by the same road
    return Experiment(parsed, ArtifactStore(store), _load_call(spec, overrides, store))


def _load_call(
    spec: str | Path | Mapping[str, Any], overrides: tuple[str, ...], store: str | Path | None
) -> str:
    """The `fedhet.load(...)` call, as a message names it: `{...}` for a mapping."""
    arguments = ["{...}" if isinstance(spec, Mapping) else repr(str(spec))]
    arguments += map(repr, overrides)
    if store is not None:
        arguments.append(f"store={str(store)!r}")
    return f"fedhet.load({', '.join(arguments)})"


@dataclass
class _QuietView:
    """A sweep's view that shows nothing (a notebook reads the returned table instead)."""

    on_change: Any = field(default=lambda state: None)
    on_progress: ProgressSink = field(default=lambda *event: None)

    def __enter__(self) -> _QuietView:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


@dataclass
class Experiment:
    spec: Spec
    store: ArtifactStore
    source: str  # the `fedhet.load(...)` call that made it, named in messages

    def __post_init__(self) -> None:
        self._runs: list[Run] = runs_of(self.spec)

    @damage_named()
    def train(self, jobs: int | None = None) -> pd.DataFrame:
        """Compute what every run is missing (in order here, or on `jobs` worker processes);
        the runs' result rows. A diverged or failed run is a row too; the first failure that is
        not a divergence is raised after the others have run."""
        rows, failures = train_runs(self._runs, self.store, Options(jobs), _QuietView())
        errors = [f for f in failures if not isinstance(f, DivergedError)]
        if errors:
            raise errors[0]
        return pd.DataFrame(units.shown_row(row) for row in rows)

    @damage_named()
    def runs(self) -> pd.DataFrame:
        """A row per run as far as the store has it: labels, seed, key, state, best and final
        test accuracy in percent (`best_test_pct`, `final_pct`), rounds, wall time (what
        `fedhet runs` prints)."""
        rows = [status.run_row(run, self.store) | {"key": run.node.key} for run in self._runs]
        return pd.DataFrame(units.shown_row(row) for row in rows)

    @damage_named()
    def metrics(self, train: bool = False) -> pd.DataFrame:
        """A row per run and round with the columns of `fedhet export` (accuracies in percent:
        `test_accuracy_pct`)."""
        self._require_stored(train, "metrics")
        return pd.DataFrame(export.long_rows(export.collect(self._runs, self.store, train)))

    @damage_named()
    def compare(
        self,
        baseline: str | None = None,
        train: bool = False,
        floor: float = comparison.FLOOR_POINTS,
    ) -> pd.DataFrame:
        """The report's paired differences: a row per metric, setting and algorithm against
        `baseline` (default the matrix's first algorithm), in the metric's `unit`: "points"
        (percentage points) for accuracies, "rounds" for rounds to a target. `floor` is the
        smallest difference in accuracy, in points as `fedhet report --floor`, a verdict calls
        a gain. With `eval.client_test`, also the personalized accuracies and the global
        model's (`personalized`)."""
        reference = report.reference_algorithm(self._runs, baseline, Console(stderr=True))
        self._require_stored(train, "compare")
        rows = self._rows(train)
        cells = report.cells(rows)
        metrics = comparison.paired_metrics(self.spec.eval.target_accuracy, validated(rows))
        if self.spec.eval.client_test is not None:
            metrics += personalized.paired_metrics()
        minimum = units.fraction(floor)
        return pd.DataFrame(
            _paired_row(metric, row, reference)
            for metric in metrics
            for row in comparison.compared(cells, reference, metric, minimum)
        )

    @damage_named()
    def personalized(self, train: bool = False) -> pd.DataFrame:
        """With `eval.client_test`, a row per run: each client's own final model on its own test
        split over the clients (`client_test_weighted_mean_pct`, `client_test_mean_pct`,
        `client_test_worst_decile_pct`, `client_test_std_pct`) and the global model's test
        accuracy (`global_accuracy_pct`, None for a method without one), in percent; the
        report's personalized section (fedhet.reports.personalized)."""
        if self.spec.eval.client_test is None:
            raise InputError(
                f"{self.source}.personalized(): the spec has no eval.client_test; set it "
                "(e.g. eval.client_test.per_client=100) to score each client on its own test set"
            )
        self._require_stored(train, "personalized")
        rows = personalized.run_rows(self._rows(train))
        return pd.DataFrame(units.shown_row(row) for row in rows)

    def _rows(self, train: bool) -> list[dict]:
        """The report's rows, with their final models' scores under `eval.client_test`."""
        console = Console(stderr=True, quiet=True)
        rows = report.collect(self._runs, self.store, console, train)
        if self.spec.eval.client_test is None:
            return rows
        return report.with_final_scores(rows, self._runs, self.store, console)

    @damage_named()
    def report(
        self,
        out: str | Path = report.DEFAULT_FOLDER,
        baseline: str | None = None,
        train: bool = False,
        floor: float = comparison.FLOOR_POINTS,
    ) -> Path:
        """Write what `fedhet report` writes into the folder `out` (as the command line, by
        default `report/` of the working directory); `floor` in points, as `compare`'s; the
        markdown file's path."""
        self._require_stored(train, "report")
        markdown, _ = report.write_report(
            self.spec,
            self._runs,
            self.store,
            Path(out),
            train=train,
            baseline=baseline,
            floor=units.fraction(floor),
        )
        return markdown

    def _require_stored(self, train: bool, reader: str) -> None:
        """InputError naming the runs not stored, the call that stores them and `reader`'s
        argument that would, unless `train`."""
        if not train:
            remedy = f"call `{self.source}.train()` first or pass {reader}(train=True)"
            require_stored(self._runs, self.store, remedy)


def _paired_row(metric: comparison.PairedMetric, row: comparison.PairedRow, reference: str):
    """A paired comparison as a row, its differences in the metric's unit."""
    c = row.comparison

    def shown(difference: float | None) -> float | None:
        return None if difference is None else comparison.in_unit(difference, metric.unit)

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
        "rounds": row.rounds,
        "differences": [shown(d) for d in row.pairing.differences],
    }


__all__ = ["Experiment", "load"]
