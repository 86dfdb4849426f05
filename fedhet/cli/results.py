"""`fedhet runs`, `eval`, `report` and `export`: what the store holds of a spec's runs, as a
table, evaluations, a paper-style report or one long table of per-round metrics."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Literal

import typer

from fedhet.cli.columns import (
    CGV_COLUMNS,
    CLIENT_TEST_COLUMNS,
    CLIENT_TEST_LIST,
    EVAL_COLUMNS,
    RUN_COLUMNS,
)
from fedhet.cli.options import (
    FormatOpt,
    SpecArgs,
    StoreOpt,
    TrainOpt,
    Where,
    example,
    out,
    say,
    spec_arguments,
)
from fedhet.cli.output import Column, Format, present, show
from fedhet.core import units
from fedhet.core.errors import InputError

commands = typer.Typer()


@commands.command(
    "runs",
    epilog=example(
        "fedhet runs specs/quickstart.yaml",
        "fedhet runs specs/quickstart.yaml --algorithm SCAFFOLD --format csv",
    ),
)
@spec_arguments
def runs(
    given: SpecArgs,
    algorithm: Annotated[
        str | None, typer.Option(help="only runs of this algorithm (its label, e.g. FedAvg)")
    ] = None,
    state: Annotated[
        str | None,
        typer.Option(
            help="only runs in this state: stored | damaged | diverged | partial | missing"
        ),
    ] = None,
    fmt: FormatOpt = Format.table,
    store: StoreOpt = None,
) -> None:
    """Every run of the spec with what the store holds of it: state (stored, damaged, diverged,
    partial, missing), best and final accuracy, rounds done and training time. A stored run's
    checksums are checked as `fedhet plan` checks them: a damaged run has no results, and a
    line on stderr says how to recompute it."""
    session = given.open(Where(store))
    rows = session.run_rows(algorithm, state)
    show(out, rows, present(RUN_COLUMNS, rows), fmt, title=session.spec.name)


@commands.command(
    "eval",
    epilog=example(
        "fedhet eval specs/quickstart.yaml --model best",
        "fedhet eval specs/quickstart.yaml seed=1 --format json --cgv",
    ),
)
@spec_arguments
def evaluate(
    given: SpecArgs,
    fmt: FormatOpt = Format.table,
    as_json: Annotated[bool, typer.Option("--json", help="the same as --format json")] = False,
    cgv: Annotated[
        bool, typer.Option("--cgv", help="also the client gradient variance of the final model")
    ] = False,
    model: Annotated[
        Literal["final", "best"],
        typer.Option("--model", help="the final model or the one with the best test accuracy"),
    ] = "final",
    where: Where = Where(),
    train: TrainOpt = False,
) -> None:
    """Global, per-class and per-client accuracy of each run's final (or best) model, whatever
    the method (TCT: its stage-2 linear model on the eNTK features). A run that diverged is
    marked so, with no scores."""
    session = given.open(where)
    reports = session.evaluations(model, cgv, train)
    if as_json or fmt is Format.json:  # the reports as they are, lists and all
        print(json.dumps([units.shown_row(report) for report in reports], indent=2))
        return
    readable = fmt is not Format.csv
    rows = [_eval_row(report, readable) for report in reports]
    spread = CLIENT_TEST_COLUMNS if session.spec.eval.client_test is not None else []
    lists = [*EVAL_COLUMNS[-2:], *([CLIENT_TEST_LIST] if spread else [])]
    diverged = [] if readable else [Column("diverged", "diverged", "number")]
    measured = present(EVAL_COLUMNS[:-2], rows)
    if not any(run.spec.algorithm.personalized for run in session.planned):  # the accuracy
        measured = [column for column in measured if column.key != "global_accuracy"]
    columns = [*measured, *diverged, *spread, *(CGV_COLUMNS if cgv else []), *lists]
    if fmt is not Format.table:
        show(out, rows, columns, fmt, given.path.stem)
        return
    # too wide for a terminal's table: listed under it instead
    show(out, rows, [c for c in columns if c not in [*spread, *lists]], fmt, given.path.stem)
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


@commands.command(
    "report",
    epilog=example(
        "fedhet report specs/quickstart.yaml",
        "fedhet report specs/quickstart.yaml federation.rounds=50 --train --out results",
    ),
)
@spec_arguments
def report(
    given: SpecArgs,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="folder for the .md and the figures (.png, .svg, .pdf); default: report, in the "
            "working directory",
            show_default=False,
        ),
    ] = None,
    where: Where = Where(),
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
    session = given.open(where)
    from fedhet.reports.report import summary

    md = session.report(out_dir, baseline, train, floor, tuned, jobs)
    out.print(summary(md), markup=False, highlight=False, soft_wrap=True)


@commands.command(
    "export",
    epilog=example(
        "fedhet export specs/quickstart.yaml --format parquet --out quickstart.parquet",
        "fedhet export specs/quickstart.yaml --tensorboard runs/ && tensorboard --logdir runs/",
    ),
)
@spec_arguments
def export(
    given: SpecArgs,
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
    where: Where = Where(),
    train: TrainOpt = False,
) -> None:
    """Every run's per-round metrics as one long table: run labels, the config fields that vary
    between runs, seed, round and each metric. With --tensorboard (and no --format or --out),
    only the TensorBoard events."""
    session = given.open(where)
    from fedhet.reports import export as exporting

    if out_file is not None:
        exporting.check_out(out_file)
    elif fmt == "parquet" and sys.stdout.isatty():
        raise InputError(
            "--format parquet is binary, not for a terminal: give --out FILE or pipe the output"
        )
    stored = session.histories(train, tensorboard)
    if tensorboard is not None:
        say(f"wrote the TensorBoard events of {len(stored)} runs under {tensorboard}")
    if fmt is not None or out_file is not None or tensorboard is None:
        rows = exporting.long_rows(stored)
        exporting.write_file(exporting.table_bytes(rows, fmt or "csv"), out_file)
        if out_file is not None:
            say(f"wrote {out_file} ({len(rows)} rows)")
