"""The `fedhet` command line."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from fedhet import __version__
from fedhet.cli import crash, signals
from fedhet.core.errors import DivergedError, FedhetError, InputError, Interrupted, RunError
from fedhet.core.spec import Spec, load_spec
from fedhet.core.store import ArtifactStore

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Federated learning under data heterogeneity, from declarative specs.",
)
spec_app = typer.Typer(no_args_is_help=True, help="Validate, inspect and hash specs.")
artifacts_app = typer.Typer(no_args_is_help=True, help="Inspect and maintain the artifact store.")


def _print_version(value: bool) -> None:
    if value:
        print(f"fedhet {__version__}")
        raise typer.Exit(0)


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="print the version"),
    ] = False,
    debug: Annotated[
        bool, typer.Option("--debug", help="print the traceback of an unexpected error")
    ] = False,
) -> None:
    """Federated learning under data heterogeneity, from declarative specs."""


app.add_typer(spec_app, name="spec")
app.add_typer(artifacts_app, name="artifacts")

out = Console()
err = Console(stderr=True)

SpecPath = Annotated[Path, typer.Argument(help="YAML experiment spec")]
StoreOpt = Annotated[
    Path | None,
    typer.Option("--store", help="artifact store (default: FEDHET_STORE or ./artifacts)"),
]
DataRootOpt = Annotated[
    Path | None,
    typer.Option("--data-root", help="dataset root (default: spec, FEDHET_DATA or ./data)"),
]


def _load(path: Path, data_root: Path | None = None) -> Spec:
    spec = load_spec(path)
    if data_root is not None:
        spec = spec.model_copy(
            update={"data": spec.data.model_copy(update={"root": str(data_root)})}
        )
    return spec


def _fmt(value) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.4f}"
    return str(value)


def _table(rows: list[dict], columns: list[str], title: str | None = None) -> Table:
    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*(_fmt(row.get(c, "")) for c in columns))
    return table


# --- spec -------------------------------------------------------------------------------


@spec_app.command("validate")
def spec_validate(path: SpecPath) -> None:
    """Check a spec; exit 2 with a one-line message naming the field when it is invalid."""
    spec = _load(path)  # before the heavy imports, so a bad spec fails fast
    from fedhet.runs import runs_of

    runs = runs_of(spec)
    out.print(f"{path}: valid ({len(runs)} run{'s' if len(runs) != 1 else ''})")


@spec_app.command("show")
def spec_show(path: SpecPath) -> None:
    """Print the spec with every default filled in, and the model's split points."""
    import yaml

    from fedhet.data.datasets import load_dataset
    from fedhet.models import build_model

    spec = _load(path)
    # plain print: rich would wrap long lines and break the YAML
    filled = spec.model_dump(mode="json", exclude_none=True, serialize_as_any=True)
    print(yaml.safe_dump(filled, sort_keys=False))
    try:
        ds = load_dataset(spec.data.dataset, spec.data.root, spec.data.download)
    except InputError:
        return
    model = build_model(spec.model, ds.shape, ds.num_classes, spec.seed)
    out.print(f"# model split points: {', '.join(model.split_points())}")


@spec_app.command("hash")
def spec_hash(path: SpecPath) -> None:
    """Print every stage's key for every run of the spec."""
    spec = _load(path)
    from fedhet.runs import runs_of

    for run in runs_of(spec):  # plain print: one unwrapped line per key, for scripts
        label = ", ".join(f"{k}={v}" for k, v in run.axes.items()) or run.spec.name
        print(f"# {label}")
        for node in run.node.walk():
            print(f"{node.stage:10s} {node.key}")


@spec_app.command("schema")
def spec_schema() -> None:
    """Print the JSON Schema of specs (for editor completion and checking)."""
    from fedhet.core.spec import json_schema

    out.print_json(json.dumps(json_schema()))


# --- stages -----------------------------------------------------------------------------


@app.command("partition")
def partition(
    path: SpecPath,
    plot: Annotated[Path | None, typer.Option(help="write a clients x classes heatmap PNG")] = None,
    store: StoreOpt = None,
    data_root: DataRootOpt = None,
) -> None:
    """Compute (or reuse) the partition of every run and print its summary."""
    from fedhet.core.pipeline import RunContext, ensure
    from fedhet.data.partition import summary_rows
    from fedhet.data.partition_stage import load_partition, partition_node

    spec = _load(path, data_root)
    st = ArtifactStore(store)
    from fedhet.core.spec import expand

    seen = set()
    for _, run_spec in expand(spec):
        node = partition_node(run_spec)
        if node.key in seen:
            continue
        seen.add(node.key)
        part = load_partition(ensure(node, RunContext(run_spec, st, err)))
        rows = summary_rows(part)
        out.print(_table(rows, list(rows[0]), title=f"partition {node.key[:12]}"))
        if plot is not None:
            from fedhet.reports.plots import partition_heatmap

            target = plot if len(seen) == 1 else plot.with_stem(f"{plot.stem}-{node.key[:8]}")
            partition_heatmap(
                part.histogram, target, title=f"{run_spec.name}: {run_spec.partition.scheme}"
            )
            out.print(f"wrote {target}")


@app.command("virtual")
def virtual(
    path: SpecPath,
    grid: Annotated[
        Path | None, typer.Option(help="write a PNG grid of samples, one row per class")
    ] = None,
    store: StoreOpt = None,
) -> None:
    """Compute (or reuse) the VHL virtual dataset of every run and print its summary."""
    from fedhet.core.pipeline import RunContext, ensure
    from fedhet.core.spec import expand
    from fedhet.methods.vhl import save_grid
    from fedhet.methods.vhl.virtual_stage import load_virtual, virtual_upstream

    st = ArtifactStore(store)
    seen = set()
    for _, run_spec in expand(_load(path)):
        node = virtual_upstream(run_spec).get("virtual")
        if node is None or node.key in seen:
            continue
        seen.add(node.key)
        images, labels = load_virtual(ensure(node, RunContext(run_spec, st, err)))
        generator = node.config["generator"]
        out.print(
            f"virtual {node.key[:12]}: {generator['kind']}, {len(labels)} images of shape "
            f"{tuple(images.shape[1:])}, {node.config['classes']} classes"
        )
        if grid is not None:
            target = grid if len(seen) == 1 else grid.with_stem(f"{grid.stem}-{node.key[:8]}")
            save_grid(images, labels, target)
            out.print(f"wrote {target}")
    if not seen:
        raise InputError(
            f"{path}: no run trains on virtual data; set algorithm.vhl (variant vhl or naive)"
        )


RESULT_COLUMNS = [
    "algorithm",
    "setting",
    "seed",
    "best_accuracy",
    "final_accuracy",
    "rounds_to_target",
    "wall_time_s",
]


@app.command("train")
def train(path: SpecPath, store: StoreOpt = None, data_root: DataRootOpt = None) -> None:
    """Run the missing stages of every run (resuming from checkpoints) and print the results.

    A diverging run does not stop the others; the command then exits 1 naming it."""
    from fedhet.runs import execute, result_row, runs_of, stored_metrics

    st = ArtifactStore(store)
    rows, diverged = [], []
    for run in runs_of(_load(path, data_root)):
        try:
            rows.append(result_row(run, stored_metrics(execute(run, st))))
        except DivergedError as error:
            diverged.append(error)
            row = result_row(run, error.metrics)
            rows.append({**row, "final_accuracy": f"diverged in round {error.round_number}"})
    columns = [c for c in RESULT_COLUMNS if any(c in r for r in rows)]
    out.print(_table(rows, columns, title=path.stem))
    if len(diverged) == 1:
        raise diverged[0]
    if diverged:
        raise RunError(f"{len(diverged)} runs diverged; the first: {diverged[0]}")


@app.command("eval")
def evaluate(
    path: SpecPath,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    cgv: Annotated[
        bool, typer.Option("--cgv", help="also the client gradient variance of the final model")
    ] = False,
    store: StoreOpt = None,
    data_root: DataRootOpt = None,
) -> None:
    """Global, per-class and per-client accuracy of each run's trained model."""
    from fedhet.reports.evaluation import evaluate_run
    from fedhet.runs import execute, runs_of

    st = ArtifactStore(store)
    reports = []
    for run in runs_of(_load(path, data_root)):
        reports.append(evaluate_run(run, execute(run, st), st, cgv=cgv))
    if as_json:
        print(json.dumps(reports, indent=2))
        return
    for rep in reports:
        out.print(
            f"[bold]{rep['algorithm']}[/bold] {rep['setting']} seed {rep['seed']}: "
            f"accuracy {rep['accuracy']:.4f}"
        )
        out.print("  per class: " + " ".join(f"{a:.3f}" for a in rep["per_class"]))
        out.print("  per client: " + " ".join(f"{a:.3f}" for a in rep["per_client"]))
        if cgv:
            out.print("  CGV: " + ", ".join(f"{k} {v:.4g}" for k, v in rep["cgv"].items()))


@app.command("report")
def report(
    path: SpecPath,
    out_dir: Annotated[Path, typer.Option("--out", help="folder for the .md and .png")] = Path(
        "reports"
    ),
    store: StoreOpt = None,
    data_root: DataRootOpt = None,
) -> None:
    """Paper-style table (algorithms x settings, mean ± std over seeds) and accuracy curves."""
    from fedhet.reports.report import write_report

    spec = _load(path, data_root)
    md, png = write_report(spec, ArtifactStore(store), out_dir, err)
    out.print(md.read_text(), markup=False, highlight=False)
    out.print(f"wrote {md} and {png}")


# --- artifacts --------------------------------------------------------------------------


@artifacts_app.command("ls")
def artifacts_ls(store: StoreOpt = None) -> None:
    """List artifacts: stage, short key, spec name, size, created."""
    rows = [
        {
            "stage": a.stage,
            "key": a.key[:12],
            "spec": a.attrs.get("spec_name", ""),
            "size": f"{a.size / 1e6:.2f} MB",
            "created": a.attrs.get("created", ""),
        }
        for a in ArtifactStore(store).ls()
    ]
    out.print(_table(rows, ["stage", "key", "spec", "size", "created"]))


@artifacts_app.command("show")
def artifacts_show(
    key: Annotated[str, typer.Argument(help="key or unambiguous key prefix")],
    store: StoreOpt = None,
) -> None:
    """Attributes and arrays (shape, chunks, dtype) of one artifact."""
    import zarr

    st = ArtifactStore(store)
    info = st.find(key)
    group = zarr.open_group(info.path, mode="r")
    attrs = {k: v for k, v in info.attrs.items() if k != "checksums"}
    out.print(f"[bold]{info.stage}/{info.key}[/bold]  ({info.path})", soft_wrap=True)
    out.print_json(json.dumps(attrs, default=str))
    table = Table("array", "shape", "chunks", "dtype")
    for name, arr in _walk_arrays(group):
        table.add_row(name, str(arr.shape), str(arr.chunks), str(arr.dtype))
    out.print(table)


def _walk_arrays(group, prefix=""):
    import zarr

    for name, member in sorted(group.members()):
        if isinstance(member, zarr.Array):
            yield f"{prefix}{name}", member
        else:
            yield from _walk_arrays(member, f"{prefix}{name}/")


@artifacts_app.command("verify")
def artifacts_verify(
    key: Annotated[str | None, typer.Argument(help="key prefix; all when omitted")] = None,
    store: StoreOpt = None,
) -> None:
    """Recompute every array checksum; exit 1 when anything is corrupt."""
    st = ArtifactStore(store)
    targets = [st.find(key)] if key else st.ls()
    bad = 0
    for info in targets:
        problems = st.verify(info.stage, info.key)
        status = "ok" if not problems else "CORRUPT: " + "; ".join(problems)
        out.print(f"{info.stage}/{info.key[:12]}: {status}")
        bad += bool(problems)
    if bad:
        raise FedhetError(f"{bad} corrupt artifact{'s' if bad > 1 else ''}")


@artifacts_app.command("gc")
def artifacts_gc(store: StoreOpt = None) -> None:
    """Remove temporaries of dead writers, finished checkpoints and stale locks."""
    removed = ArtifactStore(store).gc()
    for path in removed:
        out.print(f"removed {path}")
    out.print(f"{len(removed)} entr{'y' if len(removed) == 1 else 'ies'} removed")


def _say(message: str) -> None:
    err.print(message, markup=False, highlight=False, soft_wrap=True)


def _usage_error(exc: typer.TyperException) -> int:
    """The command line itself is wrong (unknown command or option, missing argument)."""
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError":  # a bare `fedhet` or `fedhet spec`: help
        print(ctx.get_help())
        return 0
    command = ctx.command_path if ctx is not None else "fedhet"
    message = " ".join(exc.format_message().split())
    _say(f"error: {command}: {message} (see `{command} --help`)")
    return exc.exit_code


def main() -> None:
    """The console script: every way out is an exit code and at most one line on stderr
    (0 ok, 1 failed while running, 2 bad input, 130/143 interrupted); `--debug` or
    FEDHET_DEBUG=1 adds the traceback of an unexpected exception."""
    signals.install()
    try:
        code = app(standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except FedhetError as exc:
        _say(f"error: {exc}")
        sys.exit(exc.exit_code)
    except Interrupted as exc:
        _say(str(exc))
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        _say("aborted")
        sys.exit(130)
    except typer.TyperException as exc:
        sys.exit(_usage_error(exc))
    except Exception as exc:  # a bug or an environment failure: one line, traceback in a file
        _say(crash.report(exc, debug=_debug_requested()))
        sys.exit(1)


def _debug_requested() -> bool:
    return "--debug" in sys.argv[1:] or os.environ.get("FEDHET_DEBUG") == "1"
