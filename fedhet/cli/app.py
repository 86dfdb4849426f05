"""The `fedhet` command line."""

from __future__ import annotations

import atexit
import gc
import json
import logging
import os
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console
from rich.table import Table

from fedhet import __version__
from fedhet.cli import crash, signals
from fedhet.cli.output import Column, Format, present, show
from fedhet.core import units
from fedhet.core.errors import FedhetError, InputError, RunError
from fedhet.core.memory_check import require_models_fit
from fedhet.core.spec import Spec, expand, load_mapping, load_spec, replaced_axes
from fedhet.core.store import ATTRIBUTES_CHECKSUM, INTEGRITY, ArtifactStore, arrays, damage_named
from fedhet.core.tune_spec import TuneSpec
from fedhet.data.shapes import data_shape
from fedhet.data.sizes import require_a_sample_per_client
from fedhet.process import cores
from fedhet.process.interrupts import Interrupted

# Markdown help text: a paragraph's single line breaks are joined, so it rewraps to the
# terminal's width (the rich mode keeps every source line break of a docstring)
HELP_MARKUP = "markdown"

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=HELP_MARKUP,
    pretty_exceptions_enable=False,
    help="Federated learning under data heterogeneity, from declarative specs.",
)
spec_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=HELP_MARKUP, help="Validate, inspect and hash specs."
)
artifacts_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=HELP_MARKUP,
    help="Inspect and maintain the artifact store.",
)


def _print_version(value: bool) -> None:
    if value:
        print(f"fedhet {__version__}")
        raise typer.Exit(0)


@app.callback()
def _options(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="print the version"),
    ] = False,
    debug: Annotated[
        bool, typer.Option("--debug", help="print the traceback of an unexpected error")
    ] = False,
) -> None:
    """Federated learning under data heterogeneity, from declarative specs."""
    ctx.obj = Services(_load, out, err)  # what a method's command uses of the command line


app.add_typer(spec_app, name="spec")
app.add_typer(artifacts_app, name="artifacts")

out = Console()
err = Console(stderr=True)


@dataclass(frozen=True)
class Services:
    """What the command line lends a method's command, as its `ctx.obj`."""

    load: Callable[..., Spec]  # _load: the validated spec of a path, overrides applied
    out: Console
    err: Console


SpecPath = Annotated[Path, typer.Argument(help="YAML experiment spec", metavar="SPEC")]
StoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="artifact store: a folder or s3://BUCKET/PREFIX (default: FEDHET_STORE or "
        "./artifacts)",
        metavar="DIR|URL",
    ),
]
DataRootOpt = Annotated[
    Path | None,
    typer.Option("--data-root", help="dataset root (default: spec, FEDHET_DATA or ./data)"),
]


OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="overrides PATH=VALUE, VALUE in YAML: federation.rounds=100 'matrix.seed=[0,1]'",
        metavar="[PATH=VALUE]...",
        show_default=False,
    ),
]
OnlyOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--only",
        help="keep the runs whose matrix AXIS has VALUE (an entry of a section axis by its name), "
        "repeatable: --only algorithm=fedprox --only seed=0",
        metavar="AXIS=VALUE",
        show_default=False,
    ),
]
FormatOpt = Annotated[
    Format, typer.Option("--format", help="table | markdown | csv | json", show_default=False)
]


def _load(
    path: Path,
    data_root: Path | None = None,
    overrides: list[str] | None = None,
    only: list[str] | None = None,
) -> Spec:
    """The validated spec, before any heavy import: every command starts here. An override
    that replaces a matrix axis says so in one line."""
    spec = load_spec(path, overrides or (), only or ())
    for note in replaced_axes(load_mapping(path), overrides or ()):
        err.print(note, markup=False, soft_wrap=True)
    require_a_sample_per_client(spec, path)
    require_models_fit(spec, path, data_shape)
    if data_root is not None:
        spec = spec.model_copy(
            update={"data": spec.data.model_copy(update={"root": str(data_root)})}
        )
    return spec


# --- spec -------------------------------------------------------------------------------


def _example(*commands: str) -> str:
    """A command's --help epilog: the example lines, kept as written."""
    return "Example:\n\n" + "\n\n".join(f"  $ {c}" for c in commands)


@spec_app.command("validate", epilog=_example("fedhet spec validate specs/quickstart.yaml"))
def spec_validate(path: SpecPath, overrides: OverridesArg = None, only: OnlyOpt = None) -> None:
    """Check a spec; exit 2 with a one-line message naming the field when it is invalid."""
    spec = _load(path, overrides=overrides, only=only)
    runs = expand(spec)  # no planning: validating imports no method code (and no torch)
    out.print(f"{path}: valid ({len(runs)} run{'s' if len(runs) != 1 else ''})", soft_wrap=True)


@spec_app.command("show", epilog=_example("fedhet spec show specs/quickstart.yaml model.arch=mlp"))
def spec_show(path: SpecPath, overrides: OverridesArg = None, only: OnlyOpt = None) -> None:
    """Print the spec with every default filled in (only the fields that apply to the chosen
    model and partition), and the model's split points."""
    spec = _load(path, overrides=overrides, only=only)
    import yaml

    from fedhet.core.spec import applicable_dump

    # plain print: rich would wrap long lines and break the YAML
    print(yaml.safe_dump(applicable_dump(spec), sort_keys=False))
    # known from the spec alone: no dataset loaded, no model built (and no torch imported)
    out.print(f"# model split points: {', '.join(spec.model.split_points())}")


@spec_app.command("hash", epilog=_example("fedhet spec hash specs/quickstart.yaml seed=1"))
def spec_hash(path: SpecPath, overrides: OverridesArg = None, only: OnlyOpt = None) -> None:
    """Print every stage's key for every run of the spec."""
    spec = _load(path, overrides=overrides, only=only)
    from fedhet.execution.planning import runs_of

    for run in runs_of(spec):  # plain print: one unwrapped line per key, for scripts
        print(f"# {run.label}")
        for node in run.node.walk():
            print(f"{node.stage:10s} {node.key}")


@spec_app.command("schema", epilog=_example("fedhet spec schema > spec.schema.json"))
def spec_schema() -> None:
    """Print the JSON Schema of specs (for editor completion and checking)."""
    from fedhet.core.spec import json_schema

    out.print_json(json.dumps(json_schema()))


# --- stages -----------------------------------------------------------------------------


PARTITION_COLUMNS = [
    Column("client", "client", "number"),
    Column("size", "size", "number"),
    Column("classes", "classes", "number"),
    Column("dominant_class", "top class", "number"),
    Column("dominant_share", "top %", "pct"),
    Column("hellinger", "Hellinger", "number"),
    Column("jensen_shannon", "JS", "number"),
    Column("earth_movers", "EMD", "number"),
    Column("angle", "angle", "number"),
]


@app.command(
    "partition",
    epilog=_example(
        "fedhet partition specs/quickstart.yaml --plot clients.png",
        "fedhet partition specs/quickstart.yaml 'partition={scheme: iid, clients: 5}'",
    ),
)
def partition(
    path: SpecPath,
    overrides: OverridesArg = None,
    only: OnlyOpt = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            help="write a clients x classes heatmap, a panel per partition (.png/.svg/.pdf)"
        ),
    ] = None,
    fmt: FormatOpt = Format.table,
    store: StoreOpt = None,
    data_root: DataRootOpt = None,
) -> None:
    """Compute (or reuse) the partition of every run and print its summary."""
    spec = _load(path, data_root, overrides, only)
    from fedhet.data.heterogeneity import heterogeneity
    from fedhet.data.partition import empty_clients_note, summary_rows
    from fedhet.execution.partitions import partitions
    from fedhet.execution.planning import runs_of

    flat, heatmaps = [], {}
    if plot is not None:
        from fedhet.figures import figure_format, partition_heatmaps  # matplotlib: when asked

        figure_format(plot, "--plot")  # before anything is computed
    for node, label, part in partitions(runs_of(spec), ArtifactStore(store), err):
        rows = summary_rows(part)
        columns = [c for c in PARTITION_COLUMNS if any(r.get(c.key) is not None for r in rows)]
        for_programs = fmt in (Format.csv, Format.json)  # one flat table, nothing else
        if for_programs:
            flat += [{"partition": label, "key": node.key, **r} for r in rows]
        else:
            show(out, rows, columns, fmt, title=f"{label} ({node.key[:10]})")
        notes = [
            heterogeneity(part.histogram).line(),
            empty_clients_note([r["size"] for r in rows]),
        ]
        for note in filter(None, notes):
            (err if for_programs else out).print(note)
        heatmaps[label] = part.histogram
    if plot is not None:
        partition_heatmaps(heatmaps, plot, [figure_format(plot, "--plot")])
        (err if fmt in (Format.csv, Format.json) else out).print(f"wrote {plot}")
    if flat:
        keys = [Column("partition", "partition"), Column("key", "key"), *PARTITION_COLUMNS]
        show(out, flat, keys, fmt)


@cache
def _add_method_commands() -> None:
    """The commands methods contribute (`fedhet virtual`), listed after `partition`, the other
    command of a stage; a method's code is imported only when its command runs."""
    from fedhet.core import registry

    at = 1 + next(i for i, c in enumerate(app.registered_commands) if c.name == "partition")
    for commands in registry.commands():
        app.registered_commands[at:at] = commands.registered_commands
        at += len(commands.registered_commands)


RESULT_COLUMNS = [
    Column("algorithm", "algorithm"),
    Column("setting", "setting"),
    Column("seed", "seed", "number"),
    Column("best_test", "best test %", "pct"),
    Column("test_at_best_val", "test at best val %", "pct", optional=True),
    Column("final", "final %", "pct"),
    Column("rounds_to_target", "to target", "number"),
    Column("wall_time_s", "time s", "seconds"),
]


JobsOpt = Annotated[
    int | None,
    typer.Option("--jobs", help="N worker processes on this machine share the sweep's nodes"),
]
RayOpt = Annotated[
    bool, typer.Option("--ray", help="each node a Ray task (on a local Ray fedhet starts)")
]
RayAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        metavar="HOST:PORT",
        help="run the Ray tasks on the existing cluster at HOST:PORT (implies --ray)",
    ),
]


@app.command(
    "train",
    epilog=_example(
        "fedhet train specs/quickstart.yaml",
        "fedhet train specs/quickstart.yaml federation.rounds=100 algorithm.name=fedprox "
        "algorithm.mu=0.1 'partition={scheme: iid, clients: 5}'",
        "fedhet train specs/quickstart.yaml --only algorithm=fedprox --only partition=dirichlet",
        "fedhet train specs/quickstart.yaml matrix.algorithm.1.mu=0.1",
    ),
)
def train(
    path: SpecPath,
    overrides: OverridesArg = None,
    only: OnlyOpt = None,
    fmt: FormatOpt = Format.table,
    store: StoreOpt = None,
    data_root: DataRootOpt = None,
    jobs: JobsOpt = None,
    ray: RayOpt = False,
    ray_address: RayAddressOpt = None,
    retry_diverged: Annotated[
        bool,
        typer.Option(
            "--retry-diverged",
            help="compute again the runs whose divergence is recorded (default: report it)",
        ),
    ] = False,
) -> None:
    """Run the missing stages of every run (resuming from checkpoints) and print the results.

    With --jobs or --ray, every stage of every run is scheduled as soon as what it needs is
    stored; other `fedhet train` processes on the same store share the work. A failing run does
    not stop the others; the command then exits 1 naming it (a diverged run's final accuracy
    reads "diverged k/n": in round k of n). A divergence is recorded: the next `train` reports
    it without computing the run again, unless --retry-diverged."""
    spec = _load(path, data_root, overrides, only)
    from fedhet.execution.planning import runs_of

    st = ArtifactStore(store)
    runs = runs_of(spec)
    ray_at = ray_address or ("local" if ray else None)
    rows, failures = _train(runs, st, jobs, ray_at, retry_diverged)
    columns = [c for c in present(RESULT_COLUMNS, rows) if any(c.key in r for r in rows)]
    show(out, rows, columns, fmt, title=spec.name)
    if len(failures) == 1:
        raise failures[0]
    if failures:
        raise RunError(f"{len(failures)} runs failed; the first: {failures[0]}")


def _train(
    runs: list, store: ArtifactStore, jobs: int | None, ray: str | None, retry_diverged: bool
) -> tuple[list[dict], list[FedhetError]]:
    """Compute the runs' missing stages (in `jobs` processes, or on Ray), showing progress."""
    from fedhet.cli.sweep_view import SweepView
    from fedhet.execution.train import Options
    from fedhet.execution.train import train as train_runs

    if jobs is not None and jobs < 1:
        raise InputError(f"--jobs {jobs}: give at least 1 worker process")
    live = err.is_terminal and all(run.spec.runtime.progress for run in runs)
    options = Options(jobs, ray, retry_diverged)
    return train_runs(runs, store, options, SweepView(runs, store, err, live))


@app.command(
    "plan",
    epilog=_example(
        "fedhet plan specs/quickstart.yaml",
        "fedhet plan specs/quickstart.yaml seed=1",
        "fedhet plan specs/quickstart.yaml --only algorithm=scaffold",
        "fedhet plan specs/quickstart.yaml matrix.algorithm.1.mu=0.1 --only algorithm=fedprox",
    ),
)
def plan(
    path: SpecPath,
    overrides: OverridesArg = None,
    only: OnlyOpt = None,
    fmt: FormatOpt = Format.table,
    store: StoreOpt = None,
    tune: Annotated[
        bool,
        typer.Option("--tune", help="the runs of the tune's trials (see `fedhet tune`) instead"),
    ] = False,
) -> None:
    """Every run's stages and their state: stored, partial (round k of n, from the checkpoint)
    or missing, with the time still needed where a stored run of the same stage and shape
    gives an estimate. A stage shared by several runs is listed once, under the first. With
    --tune, the trials' runs as far as the stored results decide them."""
    spec = _load(path, overrides=overrides, only=only)
    from fedhet.execution.planning import runs_of
    from fedhet.reports.status import plan_rows

    runs, unasked = runs_of(spec), 0
    if tune:
        from fedhet.tuning.runner import planned_trials

        runs, unasked = planned_trials(spec, _tune_section(spec, path), ArtifactStore(store))
    rows, summary = plan_rows(runs, ArtifactStore(store))
    if unasked:
        summary += f"; {unasked} more trials, sampled once these are stored"
    columns = [
        Column("run", "run"),
        Column("stage", "stage"),
        Column("key", "key"),
        Column("state", "state"),
        Column("runs", "runs", "number"),
        Column("left", "left"),
    ]
    if fmt in (Format.csv, Format.json):
        columns = [*columns[:-1], Column("seconds_left", "seconds_left", "seconds")]
    show(out, rows, columns, fmt, title=spec.name)
    if fmt in (Format.table, Format.markdown):
        out.print(summary)


def _tune_section(spec: Spec, path: Path) -> TuneSpec:
    if spec.tune is None:
        raise InputError(
            f"{path}: no tune section; add one, e.g. tune: {{trials: 4, seeds: [100], space: "
            "{federation.lr: {grid: [0.02, 0.05, 0.1, 0.2]}}} (docs/how-to/tune.md)"
        )
    return spec.tune


TUNE_COLUMNS = [
    Column("algorithm", "algorithm"),
    Column("setting", "setting"),
    Column("trials", "trials", "number"),
    Column("pruned", "stopped early", "number", optional=True),
    Column("chosen", "chosen"),
    Column("best_val", "best val %", "pct"),
    Column("median_val", "median val %", "pct"),
    Column("extended", "values added", optional=True),
    Column("runoff", "runoff trials", "number", optional=True),
    Column("edge", "at an edge", optional=True),
]
TRIAL_COLUMNS = [
    Column("algorithm", "algorithm"),
    Column("setting", "setting"),
    Column("trial", "trial", "number"),
    Column("values", "values"),
    Column("val_score", "val %", "pct"),
    Column("scores", "per seed %"),
    Column("pruned_at", "stopped at round", "number", optional=True),
    Column("runoff_score", "runoff mean %", "pct", optional=True),
    Column("chosen", "chosen"),
    Column("keys", "keys"),
]


@app.command(
    "tune",
    epilog=_example(
        "fedhet tune specs/tune_digits.yaml --jobs 2",
        "fedhet plan specs/tune_digits.yaml --tune",
        "fedhet report specs/tune_digits.yaml --tuned --train",
    ),
)
def tune(
    path: SpecPath,
    overrides: OverridesArg = None,
    only: OnlyOpt = None,
    fmt: FormatOpt = Format.table,
    store: StoreOpt = None,
    data_root: DataRootOpt = None,
    jobs: JobsOpt = None,
    trials: Annotated[
        bool, typer.Option("--trials", help="a row per trial instead of one per method")
    ] = False,
) -> None:
    """Select each method's hyperparameters on the validation split, as the spec's `tune:`
    section says (its space, the same budget for every method, the selection seeds).

    Every trial is an ordinary run in the store: an interrupted tune resumes, a second one
    computes nothing, and trials shared between methods or settings are computed once. The
    outcome (every trial's validation scores, the chosen configurations) is stored; `fedhet
    report SPEC --tuned` compares the chosen configurations on the test split. A choice that is
    the lowest or highest value tried is flagged (`tune.extend_edges` extends the grid)."""
    spec = _load(path, data_root, overrides, only)
    section = _tune_section(spec, path)
    from fedhet.cli.sweep_view import SweepView
    from fedhet.execution.train import Options
    from fedhet.reports.tuning import edge_notes, selection_rows, trial_rows
    from fedhet.tuning.runner import tune as run_tune

    if jobs is not None and jobs < 1:
        raise InputError(f"--jobs {jobs}: give at least 1 worker process")
    st = ArtifactStore(store)

    def view(runs: list) -> SweepView:
        live = err.is_terminal and all(run.spec.runtime.progress for run in runs)
        return SweepView(runs, st, err, live)

    outcome = run_tune(spec, section, st, Options(jobs), view, err)
    if trials:
        rows = trial_rows(outcome)
        show(out, rows, present(TRIAL_COLUMNS, rows), fmt, title=f"{spec.name}: trials")
    else:
        rows = selection_rows(outcome)
        show(out, rows, present(TUNE_COLUMNS, rows), fmt, title=f"{spec.name}: chosen")
    for note in edge_notes(outcome):
        err.print(f"warning: {note}", markup=False, highlight=False, soft_wrap=True)


RUN_COLUMNS = [
    Column("algorithm", "algorithm"),
    Column("setting", "setting"),
    Column("seed", "seed", "number"),
    Column("state", "state"),
    Column("best_test", "best test %", "pct"),
    Column("test_at_best_val", "test at best val %", "pct", optional=True),
    Column("final", "final %", "pct"),
    Column("rounds", "rounds", "number"),
    Column("wall_time_s", "time s", "seconds", optional=True),  # none until a run is stored
]


@app.command(
    "runs",
    epilog=_example(
        "fedhet runs specs/quickstart.yaml",
        "fedhet runs specs/quickstart.yaml --algorithm scaffold --format csv",
    ),
)
def runs(
    path: SpecPath,
    overrides: OverridesArg = None,
    only: OnlyOpt = None,
    algorithm: Annotated[
        str | None, typer.Option(help="only runs of this algorithm (its label, e.g. fedavg)")
    ] = None,
    state: Annotated[
        str | None,
        typer.Option(help="only runs in this state: stored | diverged | partial | missing"),
    ] = None,
    fmt: FormatOpt = Format.table,
    store: StoreOpt = None,
) -> None:
    """Every run of the spec with what the store holds of it: state (stored, diverged, partial,
    missing), best and final accuracy, rounds done and training time."""
    spec = _load(path, overrides=overrides, only=only)
    from fedhet.execution.planning import runs_of
    from fedhet.reports.status import run_row

    st = ArtifactStore(store)
    rows = [run_row(run, st) for run in runs_of(spec)]
    rows = [
        r
        for r in rows
        if (algorithm is None or r["algorithm"] == algorithm)
        and (state is None or r["state"] == state)
    ]
    show(out, rows, present(RUN_COLUMNS, rows), fmt, title=spec.name)


TrainOpt = Annotated[
    bool,
    typer.Option("--train", help="train the runs not in the store (default: exit 2 naming them)"),
]


def _stored_runs(
    path: Path, spec: Spec, store: ArtifactStore, train: bool, overrides: list[str] | None
) -> list:
    """The spec's runs; unless `train`, exit 2 naming those whose results are not stored (and
    the `fedhet train` command, overrides and a --store other than the default included, that
    stores them)."""
    from fedhet.core.store import default_root
    from fedhet.execution.planning import runs_of
    from fedhet.execution.results import require_stored

    runs = runs_of(spec)
    if not train:
        given = [] if store.root == default_root() else ["--store", str(store.root)]
        command = shlex.join(["fedhet", "train", str(path), *(overrides or ()), *given])
        require_stored(runs, store, f"run `{command}` first or pass --train")
    return runs


EVAL_COLUMNS = [
    Column("algorithm", "algorithm"),
    Column("setting", "setting"),
    Column("seed", "seed", "number"),
    Column("model", "model"),
    Column("accuracy", "accuracy %", "pct"),
    Column("own_angle", "own angle %", "pct", optional=True),
    Column("loss", "loss", "number"),
    Column("per_class", "per class %"),
    Column("per_client", "per client % (train samples)"),
]
CLIENT_TEST_COLUMNS = [  # over the clients' accuracies on their own test sets
    Column("client_test_mean", "client mean %", "pct"),
    Column("client_test_weighted_mean", "weighted mean %", "pct"),
    Column("client_test_worst_decile", "worst 10% %", "pct"),
    Column("client_test_std", "client std %", "pct"),
]
CLIENT_TEST_LIST = Column("client_test", "per client % (own test set)")
CGV_COLUMNS = [
    Column(f"cgv_{part}", f"CGV {part}", "number") for part in ("total", "features", "head")
]


@app.command(
    "eval",
    epilog=_example(
        "fedhet eval specs/quickstart.yaml --model best",
        "fedhet eval specs/quickstart.yaml seed=1 --format json --cgv",
    ),
)
def evaluate(
    path: SpecPath,
    overrides: OverridesArg = None,
    only: OnlyOpt = None,
    fmt: FormatOpt = Format.table,
    as_json: Annotated[bool, typer.Option("--json", help="the same as --format json")] = False,
    cgv: Annotated[
        bool, typer.Option("--cgv", help="also the client gradient variance of the final model")
    ] = False,
    model: Annotated[
        Literal["final", "best"],
        typer.Option("--model", help="the final model or the one with the best test accuracy"),
    ] = "final",
    store: StoreOpt = None,
    data_root: DataRootOpt = None,
    train: TrainOpt = False,
) -> None:
    """Global, per-class and per-client accuracy of each run's final (or best) model, whatever
    the method (TCT: its stage-2 linear model on the eNTK features). A run that diverged is
    marked so, with no scores."""
    spec, st = _load(path, data_root, overrides, only), ArtifactStore(store)
    from fedhet.execution.results import outcome
    from fedhet.reports.evaluation import evaluate_outcome

    runs = _stored_runs(path, spec, st, train, overrides)
    reports = [
        evaluate_outcome(run, outcome(run, st, train), st, cgv=cgv, model=model, console=err)
        for run in runs
    ]
    if as_json or fmt is Format.json:  # the reports as they are, lists and all
        print(json.dumps([units.shown_row(report) for report in reports], indent=2))
        return
    readable = fmt is not Format.csv
    rows = [_eval_row(report, readable) for report in reports]
    spread = CLIENT_TEST_COLUMNS if spec.eval.client_test is not None else []
    lists = [*EVAL_COLUMNS[-2:], *([CLIENT_TEST_LIST] if spread else [])]
    diverged = [] if readable else [Column("diverged", "diverged", "number")]
    measured = present(EVAL_COLUMNS[:-2], rows)
    columns = [*measured, *diverged, *spread, *(CGV_COLUMNS if cgv else []), *lists]
    if fmt is not Format.table:
        show(out, rows, columns, fmt, path.stem)
        return
    # too wide for a terminal's table: listed under it instead
    show(out, rows, [c for c in columns if c not in [*spread, *lists]], fmt, path.stem)
    for row in (row for row in rows if row["diverged"] is None):  # a diverged run: no lists
        out.print(f"{row['algorithm']}, {row['setting']}, seed {row['seed']}", markup=False)
        if spread:
            out.print(f"  own test sets: {_spread_text(row)}", markup=False)
        for column in lists:
            out.print(f"  {column.header}: {row[column.key]}", markup=False)


def _spread_text(row: dict) -> str:
    """The per-client accuracy on the clients' own test sets, summarized in one line."""
    if row.get("client_test_mean") is None:
        return "not measured"
    return ", ".join(
        f"{column.header.removesuffix(' %')} {units.percent(row[column.key]):.2f}%"
        for column in CLIENT_TEST_COLUMNS
    )


def _eval_row(report: dict, readable: bool) -> dict:
    """A report as one row: the per-class and per-client accuracies (on training samples, and on
    the clients' own test sets where measured) each as one cell, the client gradient variance's
    parts as numbers (none for a model that is no network, like TCT's)."""

    def joined(values: list[float] | None) -> str:
        shown = map(units.percent, values or ())
        return " ".join(f"{v:.1f}" if readable else repr(v) for v in shown)

    variance = {f"cgv_{part}": value for part, value in (report.get("cgv") or {}).items()}
    lists = ("per_class", "per_client", "client_test")
    per = {name: "not measured" if report[name] is None else joined(report[name]) for name in lists}
    if readable and report["diverged"] is not None:  # a person reads it where the accuracy goes
        per["accuracy"] = f"diverged in round {report['diverged']}"
    return {**report, **per, **variance}


@app.command(
    "report",
    epilog=_example(
        "fedhet report specs/quickstart.yaml",
        "fedhet report specs/quickstart.yaml federation.rounds=50 --train --out results",
    ),
)
def report(
    path: SpecPath,
    overrides: OverridesArg = None,
    only: OnlyOpt = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="folder for the .md and the figures (.png, .svg, .pdf); default: report, in the "
            "working directory",
            show_default=False,
        ),
    ] = None,
    store: StoreOpt = None,
    data_root: DataRootOpt = None,
    train: TrainOpt = False,
    jobs: Annotated[
        int | None,
        typer.Option("--jobs", help="with --train: N worker processes compute the missing runs"),
    ] = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            help="algorithm label (as in the table) to pair the others with; default: the first",
        ),
    ] = None,
    floor: Annotated[
        float | None,
        typer.Option(
            "--floor",
            min=0,
            help="smallest mean difference, in accuracy points, that a verdict calls ahead or "
            "behind; a smaller one whose interval excludes 0 is negligible (default 0.5)",
            show_default=False,
        ),
    ] = None,
    tuned: Annotated[
        bool,
        typer.Option(
            "--tuned",
            help="the configurations `fedhet tune` chose, over the spec's seeds, with how they "
            "were tuned (into NAME_tuned.md)",
        ),
    ] = False,
) -> None:
    """Paper-style table (algorithms x settings, mean ± std over seeds) and accuracy curves
    into a markdown file and PNG, SVG and PDF figures; prints the main table and where the rest
    is."""
    spec, st = _load(path, data_root, overrides, only), ArtifactStore(store)
    from fedhet.reports.comparison import FLOOR_POINTS
    from fedhet.reports.report import DEFAULT_FOLDER, summary, write_report

    minimum = units.fraction(FLOOR_POINTS if floor is None else floor)
    section = None
    if tuned:
        spec, runs, section = _tuned_runs(path, spec, st, train, overrides)
    else:
        runs = _stored_runs(path, spec, st, train, overrides)
    if train and jobs is not None:  # in parallel first; a failed run is a row of the report
        _train(runs, st, jobs, None, retry_diverged=False)
    folder = DEFAULT_FOLDER if out_dir is None else out_dir
    md, _ = write_report(spec, runs, st, folder, err, train, baseline, minimum, section)
    out.print(summary(md), markup=False, highlight=False, soft_wrap=True)


def _tuned_runs(
    path: Path, spec: Spec, store: ArtifactStore, train: bool, overrides: list[str] | None
) -> tuple[Spec, list, str]:
    """The spec renamed NAME_tuned, the runs of its tune's chosen configurations (stored, unless
    `train`), and the report's section on the tune."""
    from fedhet.reports.tuning import tuning_section
    from fedhet.tuning.runner import require_tuned_stored, tuned_runs

    command, section = shlex.join([str(path), *(overrides or ())]), _tune_section(spec, path)
    runs, outcome = tuned_runs(spec, section, store, command)
    if not train:
        require_tuned_stored(runs, store, command)
    renamed = spec.model_copy(update={"name": f"{spec.name}_tuned"})
    return renamed, runs, tuning_section(outcome, section)


@app.command(
    "export",
    epilog=_example(
        "fedhet export specs/quickstart.yaml --format parquet --out quickstart.parquet",
        "fedhet export specs/quickstart.yaml --tensorboard runs/ && tensorboard --logdir runs/",
    ),
)
def export(
    path: SpecPath,
    overrides: OverridesArg = None,
    only: OnlyOpt = None,
    fmt: Annotated[
        Literal["csv", "parquet", "json"] | None,
        typer.Option("--format", help="csv | parquet | json (default csv)", show_default=False),
    ] = None,
    out_file: Annotated[
        Path | None, typer.Option("--out", help="file for the table (default: standard output)")
    ] = None,
    tensorboard: Annotated[
        Path | None,
        typer.Option("--tensorboard", help="also write TensorBoard events, a folder per run"),
    ] = None,
    store: StoreOpt = None,
    data_root: DataRootOpt = None,
    train: TrainOpt = False,
) -> None:
    """Every run's per-round metrics as one long table: run labels, the config fields that vary
    between runs, seed, round and each metric. With --tensorboard (and no --format or --out),
    only the TensorBoard events."""
    spec, st = _load(path, data_root, overrides, only), ArtifactStore(store)
    from fedhet.engine.tensorboard import check_folder
    from fedhet.reports import export as exporting

    if out_file is not None:
        exporting.check_out(out_file)
    elif fmt == "parquet" and sys.stdout.isatty():
        raise InputError(
            "--format parquet is binary, not for a terminal: give --out FILE or pipe the output"
        )
    if tensorboard is not None:
        check_folder(tensorboard, "--tensorboard")
    stored = exporting.collect(_stored_runs(path, spec, st, train, overrides), st, train)
    if tensorboard is not None:
        exporting.write_tensorboard(stored, tensorboard)
        _say(f"wrote the TensorBoard events of {len(stored)} runs under {tensorboard}")
    if fmt is not None or out_file is not None or tensorboard is None:
        rows = exporting.long_rows(stored)
        exporting.write_file(exporting.table_bytes(rows, fmt or "csv"), out_file)
        if out_file is not None:
            _say(f"wrote {out_file} ({len(rows)} rows)")


# --- artifacts --------------------------------------------------------------------------


LS_COLUMNS = [
    Column("stage", "stage"),
    Column("key", "key"),
    Column("label", "label"),
    Column("size", "MB", "megabytes"),
    Column("created", "created"),
]


@artifacts_app.command(
    "ls",
    epilog=_example(
        "fedhet artifacts ls --stage train --algorithm fedavg",
        "fedhet artifacts ls --spec specs/quickstart.yaml --format json",
    ),
)
def artifacts_ls(
    stage: Annotated[str | None, typer.Option(help="only this stage, e.g. train")] = None,
    algorithm: Annotated[str | None, typer.Option(help="only runs of this algorithm")] = None,
    spec: Annotated[
        Path | None, typer.Option(help="only the stages of this spec's runs", metavar="SPEC")
    ] = None,
    fmt: FormatOpt = Format.table,
    store: StoreOpt = None,
) -> None:
    """List artifacts by the label of the run (or partition) they belong to."""
    found = ArtifactStore(store).ls()
    if spec is not None:
        loaded = _load(spec)
        from fedhet.execution.planning import runs_of

        keys = {node.key for run in runs_of(loaded) for node in run.node.walk()}
        found = [a for a in found if a.key in keys]
    rows = [
        {
            "stage": a.stage,
            "key": a.key if fmt in (Format.csv, Format.json) else a.key[:10],
            "label": a.attrs.get("label") or a.attrs.get("spec_name", ""),
            "algorithm": a.attrs.get("spec", {}).get("algorithm", {}).get("name"),
            "size": a.size,
            "created": a.attrs.get("created", "")[:16].replace("T", " "),
        }
        for a in found
        if stage in (None, a.stage)
    ]
    rows = [r for r in rows if algorithm in (None, r["algorithm"])]
    show(out, rows, LS_COLUMNS, fmt)


@artifacts_app.command("show")
def artifacts_show(
    key: Annotated[str, typer.Argument(help="key or unambiguous key prefix")],
    store: StoreOpt = None,
) -> None:
    """Attributes and arrays (shape, chunks, dtype) of one artifact."""
    st = ArtifactStore(store)
    info = st.find(key)
    group = st.open(info.stage, info.key)
    from fedhet.core.provenance import described

    attrs = {k: v for k, v in info.attrs.items() if k not in (*INTEGRITY, "environment")}
    out.print(f"[bold]{info.stage}/{info.key}[/bold]  ({info.path})", soft_wrap=True)
    out.print_json(json.dumps(attrs, default=str))
    environment = info.attrs.get("environment")
    if environment:
        out.print("[bold]computed in[/bold]")
        for name, value in described(environment).items():
            out.print(f"  {name:9s} {value}", markup=False, highlight=False, soft_wrap=True)
    table = Table("array", "shape", "chunks", "dtype")
    for name, arr in arrays(group):
        table.add_row(name, str(arr.shape), str(arr.chunks), str(arr.dtype))
    out.print(table)


@artifacts_app.command(
    "verify", epilog=_example("fedhet artifacts verify", "fedhet artifacts verify 3f2a9c1d0b")
)
def artifacts_verify(
    key: Annotated[str | None, typer.Argument(help="key prefix; all when omitted")] = None,
    store: StoreOpt = None,
) -> None:
    """Recompute every checksum (arrays, their metadata, attributes); exit 1 when anything is
    corrupt."""
    st = ArtifactStore(store)
    targets = [st.find(key)] if key else st.ls()
    bad = 0
    for info in targets:
        problems = st.verify(info.stage, info.key)
        status = "ok" if not problems else "CORRUPT: " + "; ".join(problems)
        if not problems and ATTRIBUTES_CHECKSUM not in info.attrs:
            status += " (no attribute checksum: an older artifact)"
        out.print(f"{info.stage}/{info.key[:12]}: {status}", markup=False, soft_wrap=True)
        bad += bool(problems)
    if bad:
        raise FedhetError(f"{bad} corrupt artifact{'s' if bad > 1 else ''}")


@artifacts_app.command(
    "rm",
    epilog=_example("fedhet artifacts rm 3f2a9c1d0b", "fedhet artifacts rm 3f2a9c1d0b --cascade"),
)
def artifacts_rm(
    keys: Annotated[list[str], typer.Argument(help="keys or unambiguous key prefixes")],
    cascade: Annotated[
        bool, typer.Option("--cascade", help="also remove the artifacts built on them")
    ] = False,
    store: StoreOpt = None,
) -> None:
    """Remove artifacts; one that a stored artifact was built on only with --cascade."""
    st = ArtifactStore(store)
    targets = {info.key: info for info in map(st.find, keys)}
    dependents = st.dependents(set(targets))
    if dependents and not cascade:
        names = ", ".join(f"{a.stage}/{a.key[:10]}" for a in dependents[:3])
        more = f" and {len(dependents) - 3} more" if len(dependents) > 3 else ""
        raise InputError(
            f"artifacts rm: {names}{more} depend{'s' if len(dependents) == 1 else ''} on it; "
            "remove those too with --cascade, or leave it"
        )
    for info in [*dependents, *targets.values()]:
        st.remove(info)
        out.print(f"removed {info.stage}/{info.key[:10]}  {info.attrs.get('label', '')}")


def _copy(source: ArtifactStore, destination: ArtifactStore) -> None:
    from fedhet.core.transfer import copy_artifacts

    copied = 0
    for info in copy_artifacts(source, destination):
        out.print(f"copied {info.stage}/{info.key[:12]}  {info.attrs.get('label', '')}")
        copied += 1
    out.print(f"{copied} copied to {destination.location}", soft_wrap=True)


@artifacts_app.command(
    "push", epilog=_example("fedhet artifacts push s3://my-bucket/fedhet --store artifacts")
)
def artifacts_push(
    destination: Annotated[str, typer.Argument(help="store to copy into: a folder or a URL")],
    store: StoreOpt = None,
) -> None:
    """Copy every artifact of the store missing from DESTINATION, bit for bit (rerun to resume
    an interrupted copy)."""
    _copy(ArtifactStore(store), ArtifactStore(destination))


@artifacts_app.command(
    "pull", epilog=_example("fedhet artifacts pull s3://my-bucket/fedhet --store artifacts")
)
def artifacts_pull(
    source: Annotated[str, typer.Argument(help="store to copy from: a folder or a URL")],
    store: StoreOpt = None,
) -> None:
    """Copy every artifact of SOURCE missing from the store, bit for bit (rerun to resume an
    interrupted copy)."""
    _copy(ArtifactStore(source), ArtifactStore(store))


@artifacts_app.command(
    "gc", epilog=_example("fedhet artifacts gc --dry-run", "fedhet artifacts gc")
)
def artifacts_gc(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="only list what would be removed")
    ] = False,
    store: StoreOpt = None,
) -> None:
    """Remove temporaries of dead writers, finished checkpoints and stale locks."""
    removed = ArtifactStore(store).gc(dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for path in removed:
        out.print(f"{verb} {path}", soft_wrap=True)
    count = f"{len(removed)} entr{'y' if len(removed) == 1 else 'ies'}"
    out.print(f"{count} {'would be removed' if dry_run else 'removed'}")


def _say(message: str) -> None:
    err.print(message, markup=False, highlight=False, soft_wrap=True)


def _usage_error(exc: typer.TyperException) -> int:
    """The command line itself is wrong (unknown command or option, missing argument)."""
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError":  # a bare `fedhet` or `fedhet spec`: typer
        return 0  # has printed the help already
    command = ctx.command_path if ctx is not None else "fedhet"
    message = " ".join(exc.format_message().split())
    _say(f"error: {command}: {message} (see `{command} --help`)")
    return exc.exit_code


def main() -> None:
    """The console script: every way out is an exit code and at most one line on stderr
    (0 ok, 1 failed while running, 2 bad input, 130/143 interrupted); `--debug` or
    FEDHET_DEBUG=1 adds the traceback of an unexpected exception."""
    cores.start_measuring()  # the thread default's first reading, while the imports run
    signals.install()
    _warnings_to_stderr()
    # at exit, the interpreter's last garbage collections would walk every object the imports
    # made (pydantic's, typer's: 0.1 s a command); frozen, they are left to the process's end
    atexit.register(gc.freeze)
    try:
        _add_method_commands()
        with damage_named():  # a damaged stored chunk: one line naming its artifact
            code = app(args=ray_address_form(sys.argv[1:]), standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except FedhetError as exc:
        _say(f"error: {exc}")
        sys.exit(exc.exit_code)
    except Interrupted as exc:
        _say(str(exc))
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort as exc:
        if isinstance(exc.__cause__, EOFError):  # click's Abort for an EOFError: no interrupt
            _say(crash.report(exc.__cause__, debug=_debug_requested()))
            sys.exit(1)
        _say("aborted")
        sys.exit(130)
    except typer.TyperException as exc:
        sys.exit(_usage_error(exc))
    except Exception as exc:  # a bug or an environment failure: one line, traceback in a file
        _say(crash.report(exc, debug=_debug_requested()))
        sys.exit(1)


_RAY_ADDRESS = re.compile(r"^(ray://)?[\w.-]+:\d+$|^auto$")


def ray_address_form(args: list[str]) -> list[str]:
    """`--ray HOST:PORT` (or `--ray auto`) as `--ray-address HOST:PORT`: a typer option cannot
    take an optional value, so `--ray` alone is a flag and an address after it is its value."""
    return [
        "--ray-address"
        if arg == "--ray" and i + 1 < len(args) and _RAY_ADDRESS.match(args[i + 1])
        else arg
        for i, arg in enumerate(args)
    ]


def _warnings_to_stderr() -> None:
    """fedhet's warnings (e.g. a plug-in that cannot be loaded) as `warning: ...` on stderr."""
    logger = logging.getLogger("fedhet")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("warning: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


def _debug_requested() -> bool:
    return "--debug" in sys.argv[1:] or os.environ.get("FEDHET_DEBUG") == "1"
