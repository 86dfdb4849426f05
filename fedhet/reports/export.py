"""`fedhet export`: the per-round metrics of a spec's stored runs as one long table (CSV, Parquet
or JSON), and as TensorBoard events.

One row per run and round: the run's labels (`run`, `algorithm`, `setting`), every config field
whose value differs between the runs (dotted paths such as `partition.alpha`, `federation.lr`),
`seed`, `round` (from 1), `diverged` (the round a diverged run diverged in, null for the others:
its rows are the rounds before, and that round with every metric NaN) and each stored metric
(NaN where the run did not measure it, e.g. test accuracy between evaluations; null in JSON and
in a column a run does not have), accuracies in percent under `_pct` names (`test_accuracy_pct`;
fedhet.core.units). Tables go through pyarrow, the reference implementation of Arrow and
Parquet.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.csv
import pyarrow.parquet

from fedhet.core import units
from fedhet.core.errors import InputError
from fedhet.core.files import write_atomically
from fedhet.core.store import ArtifactStore
from fedhet.engine.run_format import METRICS
from fedhet.engine.tensorboard import RoundWriter
from fedhet.execution.labels import varying_fields
from fedhet.execution.planning import Run
from fedhet.execution.results import outcome

TableFormat = Literal["csv", "parquet", "json"]


@dataclass(frozen=True)
class StoredRun:
    run: Run
    metrics: dict[str, list[float]]
    diverged: int | None = None  # the round it diverged in


def collect(runs: list[Run], store: ArtifactStore, train: bool) -> list[StoredRun]:
    """Each run with the metrics of its final artifact (computed first only when `train`), or of
    the rounds before its divergence."""
    return [
        StoredRun(run, reached.metrics, reached.diverged_round)
        for run, reached in ((run, outcome(run, store, train)) for run in runs)
    ]


def long_rows(runs: list[StoredRun]) -> list[dict[str, Any]]:
    """One row per run and round, as shown (accuracies in percent)."""
    fields = {
        path: _one_type(values)
        for path, values in varying_fields([stored.run.spec for stored in runs]).items()
    }
    stored_names = {name for stored in runs for name in stored.metrics}
    metric_names = [m for m in METRICS if m in stored_names] + sorted(stored_names - set(METRICS))
    rows = []
    for index, stored in enumerate(runs):
        run = stored.run
        labels = {"run": run.label, "algorithm": run.algorithm_label, "setting": run.setting_label}
        config = {path: values[index] for path, values in fields.items()}
        rounds = len(next(iter(stored.metrics.values()), []))
        for r in range(rounds if stored.diverged is None else stored.diverged):
            metrics = {name: _at(stored.metrics.get(name), r) for name in metric_names}
            rows.append(
                {
                    **labels,
                    **config,
                    "seed": run.spec.seed,
                    "round": r + 1,
                    "diverged": stored.diverged,
                    **units.shown_row(metrics),
                }
            )
    return rows


def _at(values: list[float] | None, index: int) -> float | None:
    """The round's value: None for a metric the run has not, NaN past its end (the round a run
    diverged in measured nothing)."""
    if values is None:
        return None
    return values[index] if index < len(values) else math.nan


def _one_type(values: list[Any]) -> list[Any]:
    """A column's values with one type: lists and mappings as JSON, and every value as text
    when the column mixes kinds (numbers with text, say); None stays None."""
    encoded = [json.dumps(v) if isinstance(v, list | dict) else v for v in values]
    kinds = {_kind(v) for v in encoded if v is not None}
    if len(kinds) <= 1:
        return encoded
    return [v if v is None or isinstance(v, str) else json.dumps(v) for v in encoded]


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    return "number" if isinstance(value, int | float) else type(value).__name__


def table_bytes(rows: list[dict[str, Any]], fmt: TableFormat) -> bytes:
    """The rows written in `fmt`."""
    if fmt == "json":
        return (json.dumps([_json_row(row) for row in rows], indent=1) + "\n").encode()
    table = pa.Table.from_pylist(rows)
    sink = pa.BufferOutputStream()
    if fmt == "csv":
        pyarrow.csv.write_csv(table, sink)
    else:
        pyarrow.parquet.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def _json_row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}


def check_out(path: Path) -> None:
    """InputError naming --out unless a file can be written at `path`."""
    folder = path.parent
    if path.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        why = "is a folder" if path.is_dir() else f"{folder} is not a writable folder"
        raise InputError(f"--out: cannot write {path} ({why}); choose another file")


def write_file(data: bytes, path: Path | None) -> None:
    """`data` into `path` (complete or not at all), or to stdout."""
    if path is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    write_atomically(path, data)


def write_tensorboard(runs: list[StoredRun], folder: Path) -> None:
    """Each run's rounds into its event folder under `folder`, as training writes them."""
    for stored in runs:
        spec = stored.run.spec
        learning_rates = spec.algorithm.learning_rates(spec)
        with RoundWriter(folder, stored.run.label) as writer:
            writer.write_rounds(stored.metrics, learning_rates)
