"""`fedhet artifacts`: list, show, verify and remove the store's artifacts, copy them to or from
another store, and collect its garbage: each command presents what the store's session
(fedhet.store_session, through fedhet.api) returns. These commands read the store only (and a
spec, for `ls --spec`)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fedhet.cli.columns import ARRAY_COLUMNS, LS_COLUMNS
from fedhet.cli.options import (
    CommandLineOptions,
    FormatOpt,
    SpecArgs,
    StoreOpt,
    example,
    group,
    out,
)
from fedhet.cli.output import Format, show
from fedhet.core.errors import FedhetError
from fedhet.core.store import GRACE_S

if TYPE_CHECKING:
    from fedhet.store_session import StoreSession

commands = group("Inspect and maintain the artifact store.")


def opened(store: str | None) -> StoreSession:
    """The store's session (fedhet.api), its messages naming options."""
    from fedhet.api import open_store

    return open_store(store, CommandLineOptions())


@commands.command(
    "ls",
    epilog=example(
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
    session = opened(store)
    runs = None if spec is None else SpecArgs(spec, [], []).check()
    rows = session.ls_rows(stage, algorithm, runs)
    if fmt not in (Format.csv, Format.json):
        rows = [row | {"key": row["key"][:10]} for row in rows]
    show(out, rows, LS_COLUMNS, fmt)


@commands.command("show")
def artifacts_show(
    key: Annotated[str, typer.Argument(help="key or unambiguous key prefix")],
    store: StoreOpt = None,
) -> None:
    """Attributes and arrays (shape, chunks, dtype) of one artifact."""
    shown = opened(store).view(key)
    out.print(f"[bold]{shown.stage}/{shown.key}[/bold]  ({shown.path})", soft_wrap=True)
    out.print_json(json.dumps(shown.attributes, default=str))
    if shown.environment:
        out.print("[bold]computed in[/bold]")
        for name, value in shown.environment.items():
            out.print(f"  {name:9s} {value}", markup=False, highlight=False, soft_wrap=True)
    arrays = [
        {
            "array": a["name"],
            "shape": str(a["shape"]),
            "chunks": str(a["chunks"]),
            "dtype": a["dtype"],
        }
        for a in shown.arrays
    ]
    show(out, arrays, ARRAY_COLUMNS, Format.table)


@commands.command(
    "verify", epilog=example("fedhet artifacts verify", "fedhet artifacts verify 3f2a9c1d0b")
)
def artifacts_verify(
    key: Annotated[str | None, typer.Argument(help="key prefix; all when omitted")] = None,
    store: StoreOpt = None,
) -> None:
    """Recompute every checksum (arrays, their metadata, attributes); exit 1 when anything is
    corrupt."""
    bad = 0
    for row in opened(store).verified(key):
        out.print(
            f"{row['stage']}/{row['key'][:12]}: {row['status']}", markup=False, soft_wrap=True
        )
        bad += bool(row["problems"])
    if bad:
        raise FedhetError(f"{bad} corrupt artifact{'s' if bad > 1 else ''}")


@commands.command(
    "rm",
    epilog=example("fedhet artifacts rm 3f2a9c1d0b", "fedhet artifacts rm 3f2a9c1d0b --cascade"),
)
def artifacts_rm(
    keys: Annotated[list[str], typer.Argument(help="keys or unambiguous key prefixes")],
    cascade: Annotated[
        bool, typer.Option("--cascade", help="also remove the artifacts built on them")
    ] = False,
    store: StoreOpt = None,
) -> None:
    """Remove artifacts; one that a stored artifact was built on only with --cascade."""
    for row in opened(store).removed(keys, cascade):
        out.print(f"removed {row['stage']}/{row['key'][:10]}  {row['label']}")


def _transfer(name: str, other: str, outward: bool) -> None:
    """Register `fedhet artifacts push` (`outward`: the store's artifacts copied into the store
    given as the argument `other`) or `pull` (the other's copied into the store)."""

    def transfer(store: str | None, **given: str) -> None:
        ours, theirs = opened(store), opened(given[other])
        source, destination = (ours, theirs) if outward else (theirs, ours)
        copied = 0
        for row in source.copied_to(destination):
            out.print(f"copied {row['stage']}/{row['key'][:12]}  {row['label']}")
            copied += 1
        out.print(f"{copied} copied to {destination.store.location}", soft_wrap=True)

    direction, missing = "into", f"of the store missing from {other.upper()}"
    if not outward:
        direction, missing = "from", f"of {other.upper()} missing from the store"
    argument = typer.Argument(help=f"store to copy {direction}: a folder or a URL")
    transfer.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(other, KEYWORD, annotation=Annotated[str, argument]),
            inspect.Parameter("store", KEYWORD, annotation=StoreOpt, default=None),
        ]
    )
    transfer.__doc__ = (
        f"Copy every artifact {missing}, bit for bit (rerun to resume an interrupted copy)."
    )
    epilog = example(f"fedhet artifacts {name} s3://my-bucket/fedhet --store artifacts")
    commands.command(name, epilog=epilog)(transfer)


KEYWORD = inspect.Parameter.POSITIONAL_OR_KEYWORD
_transfer("push", "destination", outward=True)
_transfer("pull", "source", outward=False)


@commands.command("gc", epilog=example("fedhet artifacts gc --dry-run", "fedhet artifacts gc"))
def artifacts_gc(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="only list what would be removed")
    ] = False,
    grace: Annotated[
        float,
        typer.Option(
            "--grace",
            help="on an object store: seconds for which a writer's files without a commit "
            "marker are left alone (it may be at work)",
        ),
    ] = GRACE_S,
    store: StoreOpt = None,
) -> None:
    """Remove temporaries of dead writers, finished checkpoints and stale locks (on an object
    store, on the server too: files without a commit marker, unreferenced objects)."""
    removed = opened(store).collected(dry_run, grace)
    verb = "would remove" if dry_run else "removed"
    for path in removed:
        out.print(f"{verb} {path}", soft_wrap=True)
    count = f"{len(removed)} entr{'y' if len(removed) == 1 else 'ies'}"
    out.print(f"{count} {'would be removed' if dry_run else 'removed'}")
