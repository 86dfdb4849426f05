"""`fedhet artifacts`: list, show, verify and remove the store's artifacts, and collect its
garbage. These commands read the store only (and a spec, for `ls --spec`)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from fedhet.cli.columns import LS_COLUMNS
from fedhet.cli.options import FormatOpt, StoreOpt, example, group, load, out
from fedhet.cli.output import Format, show
from fedhet.core.errors import FedhetError, InputError
from fedhet.core.sealed import ATTRIBUTES_CHECKSUM, INTEGRITY, arrays
from fedhet.core.store import GRACE_S, ArtifactStore

commands = group("Inspect and maintain the artifact store.")


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
    found = ArtifactStore(store).ls()
    if spec is not None:
        loaded = load(spec)
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


@commands.command("show")
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


@commands.command(
    "verify", epilog=example("fedhet artifacts verify", "fedhet artifacts verify 3f2a9c1d0b")
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


def _transfer(name: str, other: str, outward: bool) -> None:
    """Register `fedhet artifacts push` (`outward`: the store's artifacts copied into the store
    given as the argument `other`) or `pull` (the other's copied into the store)."""

    def transfer(store: str | None, **given: str) -> None:
        ours, theirs = ArtifactStore(store), ArtifactStore(given[other])
        _copy(*((ours, theirs) if outward else (theirs, ours)))

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
            min=0,
            help="on an object store: seconds for which a writer's files without a commit "
            "marker are left alone (it may be at work)",
        ),
    ] = GRACE_S,
    store: StoreOpt = None,
) -> None:
    """Remove temporaries of dead writers, finished checkpoints and stale locks (on an object
    store, on the server too: files without a commit marker, unreferenced objects)."""
    removed = ArtifactStore(store).gc(dry_run=dry_run, grace_s=grace)
    verb = "would remove" if dry_run else "removed"
    for path in removed:
        out.print(f"{verb} {path}", soft_wrap=True)
    count = f"{len(removed)} entr{'y' if len(removed) == 1 else 'ies'}"
    out.print(f"{count} {'would be removed' if dry_run else 'removed'}")
