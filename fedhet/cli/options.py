"""What the commands share, declared once: the consoles, the options and arguments most
commands take (as typer `Annotated` aliases), a spec command's first three arguments
(`spec_arguments`) and the spec they load, through the loading every entry point takes
(fedhet.execution.loading)."""

from __future__ import annotations

import inspect
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from fedhet.cli.output import Format
from fedhet.core.errors import InputError
from fedhet.core.spec import Spec
from fedhet.core.store import ArtifactStore
from fedhet.core.tune_spec import TuneSpec

# Markdown help text: a paragraph's single line breaks are joined, so it rewraps to the
# terminal's width (the rich mode keeps every source line break of a docstring)
HELP_MARKUP = "markdown"

out = Console()
err = Console(stderr=True)


def say(message: str) -> None:
    """A line for the person at the terminal, on stderr (stdout keeps the command's output)."""
    err.print(message, markup=False, highlight=False, soft_wrap=True)


def example(*commands: str) -> str:
    """A command's --help epilog: the example lines, kept as written."""
    return "Example:\n\n" + "\n\n".join(f"  $ {c}" for c in commands)


def group(help_text: str) -> typer.Typer:
    """A group of commands (`fedhet spec ...`); nameless, its commands join the parent's."""
    return typer.Typer(no_args_is_help=True, rich_markup_mode=HELP_MARKUP, help=help_text)


SpecPath = Annotated[Path, typer.Argument(help="YAML experiment spec", metavar="SPEC")]
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
FormatOpt = Annotated[
    Format, typer.Option("--format", help="table | markdown | csv | json", show_default=False)
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
TrainOpt = Annotated[
    bool,
    typer.Option("--train", help="train the runs not in the store (default: exit 2 naming them)"),
]


def load(
    path: Path,
    data_root: Path | None = None,
    overrides: list[str] | None = None,
    only: list[str] | None = None,
) -> Spec:
    """The checked spec, before any heavy import: every command starts here (as `fedhet.load`
    does), `data_root` replacing the spec's. An override that replaces a matrix axis says so."""
    from fedhet.execution.loading import checked_spec

    spec = checked_spec(path, overrides or (), only or (), note=say)
    if data_root is None:
        return spec
    return spec.model_copy(update={"data": spec.data.model_copy(update={"root": str(data_root)})})


@dataclass(frozen=True)
class SpecArgs:
    """A spec command's first arguments: SPEC, its overrides and its --only filters."""

    path: Path
    overrides: list[str]
    only: list[str]

    def load(self, data_root: Path | None = None) -> Spec:
        return load(self.path, data_root, self.overrides, self.only)

    def stored_runs(self, spec: Spec, store: ArtifactStore, train: bool) -> list:
        """The spec's runs; unless `train`, exit 2 naming those whose results are not stored
        (and the `fedhet train` command, overrides and a --store other than the default
        included, that stores them)."""
        from fedhet.core.store import default_root
        from fedhet.execution.planning import runs_of
        from fedhet.execution.results import require_stored

        runs = runs_of(spec)
        if not train:
            given = [] if store.location == default_root() else ["--store", store.location]
            command = shlex.join(["fedhet", "train", str(self.path), *self.overrides, *given])
            require_stored(runs, store, f"run `{command}` first or pass --train")
        return runs

    def tune_section(self, spec: Spec) -> TuneSpec:
        if spec.tune is None:
            raise InputError(
                f"{self.path}: no tune section; add one, e.g. tune: {{trials: 4, seeds: [100], "
                "space: {federation.lr: {grid: [0.02, 0.05, 0.1, 0.2]}}} (docs/how-to/tune.md)"
            )
        return spec.tune


@dataclass(frozen=True)
class Where:
    """Where a command reads and writes: its --store and --data-root, two options that
    `spec_arguments` hands to the command as one parameter annotated `Where`."""

    store: str | None = None
    data_root: Path | None = None


_WHERE_PARAMETERS = [
    inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=kind, default=None)
    for name, kind in [("store", StoreOpt), ("data_root", DataRootOpt)]
]
_SPEC_PARAMETERS = [
    inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=kind, **default)
    for name, kind, default in [
        ("path", SpecPath, {}),
        ("overrides", OverridesArg, {"default": None}),
        ("only", OnlyOpt, {"default": None}),
    ]
]


def spec_arguments(command: Callable[..., Any]) -> Callable[..., Any]:
    """`command(given: SpecArgs, OPTION...)` as typer reads a command: SPEC [PATH=VALUE]...
    --only AXIS=VALUE, then the command's own options, a parameter annotated `Where` read as
    --store and --data-root."""
    _, *options = inspect.signature(command, eval_str=True).parameters.values()
    wheres = [option.name for option in options if option.annotation is Where]
    parameters = [
        *_SPEC_PARAMETERS,
        *(p for o in options for p in (_WHERE_PARAMETERS if o.name in wheres else [o])),
    ]

    def called(path: Path, overrides: list[str] | None, only: list[str] | None, **given: Any):
        for name in wheres:
            given[name] = Where(given.pop("store"), given.pop("data_root"))
        return command(SpecArgs(path, overrides or [], only or []), **given)

    called.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    called.__doc__, called.__name__ = command.__doc__, command.__name__
    return called
