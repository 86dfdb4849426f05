"""The `fedhet` command line: the root command, its groups (fedhet.cli.spec, .run, .results,
.artifacts; each command presents what fedhet.api and the layers under it compute), the
methods' commands (added through their plug-ins) and `main`, the console script, which turns
every way out into an exit code and at most one line on stderr."""

from __future__ import annotations

import atexit
import gc
import logging
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Annotated

import typer
from rich.console import Console

from fedhet import __version__
from fedhet.cli import artifacts, crash, results, run, signals, spec
from fedhet.cli.options import HELP_MARKUP, err, load, out, say
from fedhet.core.errors import FedhetError
from fedhet.core.sealed import damage_named
from fedhet.core.spec import Spec
from fedhet.process import cores
from fedhet.process.interrupts import Interrupted

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=HELP_MARKUP,
    pretty_exceptions_enable=False,
    help="Federated learning under data heterogeneity, from declarative specs.",
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
    ctx.obj = Services(load, out, err)  # what a method's command uses of the command line


@dataclass(frozen=True)
class Services:
    """What the command line lends a method's command, as its `ctx.obj`."""

    load: Callable[..., Spec]  # fedhet.cli.options.load: the checked spec, overrides applied
    out: Console
    err: Console


# the methods' commands (`fedhet virtual`) join this group when `main` starts (plug-ins are
# loaded then, once their warnings have somewhere to go), listed after `partition`, the other
# command of a stage; a method's code is imported only when its command runs
_method_commands = typer.Typer()

app.add_typer(run.partition_commands)
app.add_typer(_method_commands)
app.add_typer(run.commands)
app.add_typer(results.commands)
app.add_typer(spec.commands, name="spec")
app.add_typer(artifacts.commands, name="artifacts")


@cache
def _add_method_commands() -> None:
    from fedhet.core import registry

    for commands in registry.commands():
        _method_commands.add_typer(commands)


def _usage_error(exc: typer.TyperException) -> int:
    """The command line itself is wrong (unknown command or option, missing argument)."""
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError":  # a bare `fedhet` or `fedhet spec`: typer
        return 0  # has printed the help already
    command = ctx.command_path if ctx is not None else "fedhet"
    message = " ".join(exc.format_message().split())
    say(f"error: {command}: {message} (see `{command} --help`)")
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
        say(f"error: {exc}")
        sys.exit(exc.exit_code)
    except Interrupted as exc:
        say(str(exc))
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort as exc:
        if isinstance(exc.__cause__, EOFError):  # click's Abort for an EOFError: no interrupt
            say(crash.report(exc.__cause__, debug=_debug_requested()))
            sys.exit(1)
        say("aborted")
        sys.exit(130)
    except typer.TyperException as exc:
        sys.exit(_usage_error(exc))
    except Exception as exc:  # a bug or an environment failure: one line, traceback in a file
        say(crash.report(exc, debug=_debug_requested()))
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
