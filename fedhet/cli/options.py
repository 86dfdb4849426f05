"""What the commands share, declared once: the consoles, the options and arguments most
commands take (as typer `Annotated` aliases), a spec command's first three arguments
(`spec_arguments`) and the spec they load, through the loading every entry point takes
(fedhet.execution.loading)."""

from __future__ import annotations

import inspect
import shlex
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, get_type_hints

import typer
from rich.console import Console

from fedhet.cli.output import Format
from fedhet.core.command_line import DataRootOpt, OnlyOpt, OverridesArg, SpecPath, StoreOpt
from fedhet.core.spec import Spec
from fedhet.execution.caller import Recomputer, removal

if TYPE_CHECKING:
    from fedhet.cli.sweep_view import SweepView
    from fedhet.core.store import ArtifactStore
    from fedhet.execution.planning import Run
    from fedhet.session import Session
    from fedhet.spec_session import SpecSession

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
    """The checked spec, before any heavy import (as `fedhet.load` checks it), `data_root`
    replacing the spec's. An override that replaces a matrix axis says so."""
    from fedhet.api import checked

    return checked(path, overrides or (), only or (), data_root, say)


@dataclass(frozen=True)
class SpecArgs:
    """A spec command's first arguments: SPEC, its overrides and its --only filters."""

    path: Path
    overrides: list[str]
    only: list[str]

    def check(self) -> SpecSession:
        """The spec's session with no store (`fedhet spec`), as `open` checks it."""
        from fedhet.api import open_spec_session

        voice = CommandLine(self.path, self.overrides, None)
        return open_spec_session(self.path, self.overrides, voice, err, self.only, say)

    def open(self, where: Where | None = None) -> Session:
        """The spec's session (fedhet.api), over the --store and --data-root of `where`, its
        messages naming options and commands, its progress on stderr."""
        from fedhet.api import open_session

        where = where or Where()
        voice = CommandLine(self.path, self.overrides, where.store)
        session = open_session(
            self.path, self.overrides, voice, err, where.store, self.only, where.data_root, say
        )
        session.view = partial(sweep_view, store=session.store)
        return session


class CommandLineOptions:
    """Arguments in the command line's words (fedhet.execution.caller.Wording): options."""

    def option(self, name: str) -> str:
        return f"--{name.replace('_', '-')}"

    def setting(self, name: str, value: object) -> str:
        shown = repr(value) if isinstance(value, str) else value
        return f"{self.option(name)} {shown}"

    def flag(self, name: str) -> str:
        return self.option(name)


@dataclass(frozen=True)
class CommandLine(CommandLineOptions):
    """Messages in the command line's words (fedhet.execution.caller.Voice): options, commands to
    run next with the spec's overrides (and a --store other than the default)."""

    path: Path
    overrides: list[str]
    store: str | None

    def train_first(self, reader: str) -> str:
        return f"run `{self._command('train', *self._store_option())}` first or pass --train"

    def tune_first(self) -> str:
        return f"run `{self._command('tune', *self._store_option())}` first"

    def train_tuned(self) -> str:
        command = self._command("report", "--tuned", "--train", *self._store_option())
        return f"compute them with `{command}`"

    def recompute(self, key: str, cascade: bool, command: Recomputer) -> str:
        store = self._store_option()
        again = self._command(command, *store)
        return f"`{removal(key, cascade, store)}`, then `{again}` recomputes it"

    def _store_option(self) -> list[str]:
        """--store as given, unless it names the default store."""
        from fedhet.core.store import default_root

        return [] if self.store in (None, default_root()) else ["--store", self.store]

    def _command(self, name: str, *options: str) -> str:
        return shlex.join(["fedhet", name, str(self.path), *self.overrides, *options])


def sweep_view(runs: list[Run], store: ArtifactStore) -> SweepView:
    """The live view of the runs' progress on stderr (redrawn in place on a terminal)."""
    from fedhet.cli.sweep_view import SweepView

    live = err.is_terminal and all(run.spec.runtime.progress for run in runs)
    return SweepView(runs, store, err, live)


class OptionGroup:
    """Options a command takes as one parameter: a frozen dataclass whose fields are the
    options (typer `Annotated` aliases, with their defaults), which `spec_arguments` spreads
    into the command's options and gathers again."""


@dataclass(frozen=True)
class Where(OptionGroup):
    """Where a command reads and writes: --store and --data-root."""

    store: StoreOpt = None
    data_root: DataRootOpt = None


@dataclass(frozen=True)
class Sweep(OptionGroup):
    """Where a command reads and writes, and on how many worker processes it computes."""

    store: StoreOpt = None
    data_root: DataRootOpt = None
    jobs: JobsOpt = None

    @property
    def where(self) -> Where:
        return Where(self.store, self.data_root)


_SPEC_PARAMETERS = [
    inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=kind, **default)
    for name, kind, default in [
        ("path", SpecPath, {}),
        ("overrides", OverridesArg, {"default": None}),
        ("only", OnlyOpt, {"default": None}),
    ]
]


def _group(parameter: inspect.Parameter) -> type[OptionGroup] | None:
    kind = parameter.annotation
    return kind if isinstance(kind, type) and issubclass(kind, OptionGroup) else None


def _spread(group: type[OptionGroup]) -> list[inspect.Parameter]:
    """The group's fields as a command's parameters."""
    hints = get_type_hints(group, include_extras=True)
    return [
        inspect.Parameter(
            f.name,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            annotation=hints[f.name],
            default=f.default,
        )
        for f in fields(group)  # type: ignore[arg-type]
    ]


def spec_arguments(command: Callable[..., Any]) -> Callable[..., Any]:
    """`command(given: SpecArgs, OPTION...)` as typer reads a command: SPEC [PATH=VALUE]...
    --only AXIS=VALUE, then the command's own options, a parameter annotated with an
    OptionGroup (`Where`: --store and --data-root) read as the group's options."""
    _, *options = inspect.signature(command, eval_str=True).parameters.values()
    groups = {option.name: group for option in options if (group := _group(option))}
    parameters = [
        *_SPEC_PARAMETERS,
        *(p for o in options for p in (_spread(groups[o.name]) if o.name in groups else [o])),
    ]

    def called(path: Path, overrides: list[str] | None, only: list[str] | None, **given: Any):
        for name, group in groups.items():
            given[name] = group(**{f.name: given.pop(f.name) for f in fields(group)})  # type: ignore[arg-type]
        return command(SpecArgs(path, overrides or [], only or []), **given)

    called.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    called.__doc__, called.__name__ = command.__doc__, command.__name__
    return called
