"""`fedhet partition`, `train`, `plan` and `tune`: computing a spec's runs (or their partitions,
or the tune's trials) and saying how far the store has them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedhet.cli.columns import (
    PARTITION_COLUMNS,
    PLAN_COLUMNS,
    RESULT_COLUMNS,
    TRIAL_COLUMNS,
    TUNE_COLUMNS,
)
from fedhet.cli.options import (
    FormatOpt,
    RayAddressOpt,
    RayOpt,
    SpecArgs,
    StoreOpt,
    Sweep,
    Where,
    err,
    example,
    out,
    say,
    spec_arguments,
)
from fedhet.cli.output import Column, Format, piped, present, show
from fedhet.core.errors import RunError

# two groups, so that the methods' commands (`fedhet virtual`) list after `partition`, the
# other command of a stage (fedhet.cli.app)
partition_commands = typer.Typer()
commands = typer.Typer()


@partition_commands.command(
    "partition",
    epilog=example(
        "fedhet partition specs/quickstart.yaml --plot report/clients.png",
        "fedhet partition specs/quickstart.yaml 'partition={scheme: iid, clients: 5}'",
    ),
)
@spec_arguments
def partition(
    given: SpecArgs,
    plot: Annotated[
        Path | None,
        typer.Option(
            help="write a clients x classes heatmap, a panel per partition (.png/.svg/.pdf)"
        ),
    ] = None,
    fmt: FormatOpt = Format.table,
    where: Where = Where(),
) -> None:
    """Compute (or reuse) the partition of every run and print its summary."""
    session = given.open(where)
    from fedhet.data.heterogeneity import heterogeneity
    from fedhet.data.partition import empty_clients_note, summary_rows

    flat, heatmaps = [], {}
    if plot is not None:
        from fedhet.figures import figure_format, partition_heatmaps  # matplotlib: when asked

        figure_format(plot, "--plot")  # before anything is computed
    for_programs = fmt in (Format.csv, Format.json)  # one flat table, nothing else
    for node, label, part in session.partitions():
        rows = summary_rows(part)
        columns = [c for c in PARTITION_COLUMNS if any(r.get(c.key) is not None for r in rows)]
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
        formats = [figure_format(plot, "--plot")]
        partition_heatmaps(heatmaps, plot, formats, lambda h: heterogeneity(h).caption())
        (err if for_programs else out).print(f"wrote {plot}")
    if flat:
        keys = [Column("partition", "partition"), Column("key", "key"), *PARTITION_COLUMNS]
        show(out, flat, keys, fmt)


@commands.command(
    "train",
    epilog=example(
        "fedhet train specs/quickstart.yaml",
        "fedhet train specs/quickstart.yaml federation.rounds=100 algorithm.name=fedprox "
        "algorithm.mu=0.1 'partition={scheme: iid, clients: 5}'",
        "fedhet train specs/quickstart.yaml --only algorithm=fedprox --only partition=dirichlet",
        "fedhet train specs/quickstart.yaml matrix.algorithm.1.mu=0.1",
    ),
)
@spec_arguments
def train(
    given: SpecArgs,
    fmt: FormatOpt = Format.table,
    sweep: Sweep = Sweep(),
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
    session = given.open(sweep.where)
    ray_at = ray_address or ("local" if ray else None)
    rows, failures = session.train_rows(sweep.jobs, ray_at, retry_diverged)
    columns = [c for c in present(RESULT_COLUMNS, rows) if any(c.key in r for r in rows)]
    show(out, rows, columns, fmt, title=session.spec.name)
    if len(failures) == 1:
        raise failures[0]
    if failures:
        raise RunError(f"{len(failures)} runs failed; the first: {failures[0]}")


@commands.command(
    "plan",
    epilog=example(
        "fedhet plan specs/quickstart.yaml",
        "fedhet plan specs/quickstart.yaml seed=1",
        "fedhet plan specs/quickstart.yaml --only algorithm=scaffold",
        "fedhet plan specs/quickstart.yaml matrix.algorithm.1.mu=0.1 --only algorithm=fedprox",
    ),
)
@spec_arguments
def plan(
    given: SpecArgs,
    fmt: FormatOpt = Format.table,
    store: StoreOpt = None,
    tune: Annotated[
        bool,
        typer.Option("--tune", help="the runs of the tune's trials (see `fedhet tune`) instead"),
    ] = False,
) -> None:
    """Every run's stages and their state: stored, damaged (its checksums fail: a line on
    stderr says how to recompute it), partial (round k of n, from the checkpoint) or missing,
    with the time still needed where a stored run of the same stage and shape gives an
    estimate (the summary names the stages its time covers when others have none). A stage
    shared by several runs is listed once, under the first. With --tune, the trials' runs as
    far as the stored results decide them."""
    session = given.open(Where(store))
    rows, summary = session.plan_rows(tune)
    columns = PLAN_COLUMNS
    if fmt in (Format.csv, Format.json):
        columns = [*columns[:-1], Column("seconds_left", "seconds_left", "seconds")]
    show(out, rows, columns, fmt, title=session.spec.name)
    if fmt in (Format.table, Format.markdown):
        out.print(summary, soft_wrap=piped(out))  # piped: one line, as the table


@commands.command(
    "tune",
    epilog=example(
        "fedhet tune specs/tune_digits.yaml --jobs 2",
        "fedhet plan specs/tune_digits.yaml --tune",
        "fedhet report specs/tune_digits.yaml --tuned --train",
    ),
)
@spec_arguments
def tune(
    given: SpecArgs,
    fmt: FormatOpt = Format.table,
    trials: Annotated[
        bool, typer.Option("--trials", help="a row per trial instead of one per method")
    ] = False,
    sweep: Sweep = Sweep(),
) -> None:
    """Select each method's hyperparameters on the validation split, as the spec's `tune:`
    section says (its space, the same budget for every method, the selection seeds).

    Every trial is an ordinary run in the store: an interrupted tune resumes, a second one
    computes nothing, and trials shared between methods or settings are computed once. The
    outcome (every trial's validation scores, the chosen configurations) is stored; `fedhet
    report SPEC --tuned` compares the chosen configurations on the test split. A choice that is
    the lowest or highest value tried is flagged (`tune.extend_edges` extends the grid)."""
    session = given.open(sweep.where)
    from fedhet.reports.tuning import edge_notes, selection_rows, trial_rows

    outcome = session.tune_outcome(sweep.jobs)
    name = session.spec.name
    if trials:
        rows = trial_rows(outcome)
        show(out, rows, present(TRIAL_COLUMNS, rows), fmt, title=f"{name}: trials")
    else:
        rows = selection_rows(outcome)
        show(out, rows, present(TUNE_COLUMNS, rows), fmt, title=f"{name}: chosen")
    for note in edge_notes(outcome):
        say(f"warning: {note}")
