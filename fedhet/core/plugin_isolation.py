"""A plug-in's failure stays its own.

fedhet runs a plug-in's code when it loads an entry point (`fedhet.methods`, `fedhet.datasets`,
`fedhet.models`), registers what the entry point names, imports a method's stages, commands and
objective wrappers, and validates a spec block with a plug-in's config. Whatever that code raises
there (any Exception, SystemExit, a KeyboardInterrupt of its own) becomes a `PluginError`, one
line naming the plug-in (its entry point) and its distribution (name and version): a plug-in that
cannot be loaded costs one warning (logged here; the CLI prints it as `warning: ...`) and is
skipped, so every command and spec that does not use it works unchanged, and a spec that uses it
is refused in one line (exit 2).

Ctrl-C is not the plug-in's failure. The command line turns SIGINT into
`fedhet.process.interrupts.Interrupted`, which passes through; under any other SIGINT handler
(Python's own, when fedhet is a library) a SIGINT that arrives while the plug-in's code runs is
noted, and the KeyboardInterrupt it raises passes through too. Only a KeyboardInterrupt that the
plug-in raises itself (no signal arrived) is taken for its failure: a module that raises it on
import would otherwise stop every command, and nothing else tells a user which package did.
"""

from __future__ import annotations

import logging
import signal
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from typing import Any

from pydantic import ValidationError

from fedhet.core.errors import FedhetError, InputError
from fedhet.process.interrupts import Interrupted

log = logging.getLogger(__name__)


class PluginError(InputError):
    """A plug-in that failed, or a spec that uses one: the message names the plug-in."""


@dataclass(frozen=True)
class Plugin:
    """An entry point and the distribution that declares it."""

    entry: EntryPoint

    @property
    def package(self) -> str:
        """The top-level module the entry point's object lives in."""
        return self.entry.module.partition(".")[0]

    @property
    def distribution(self) -> str:
        """The distribution's name (the package's, for an entry point made without one)."""
        dist = getattr(self.entry, "dist", None)
        return dist.name if dist is not None else self.package

    @property
    def builtin(self) -> bool:
        return self.distribution == "fedhet"

    def __str__(self) -> str:
        dist = getattr(self.entry, "dist", None)
        version = f" {dist.version}" if dist is not None else ""
        return f"plugin {self.distribution!r}{version} ({self.entry.name} = {self.entry.value})"


def load_order(entry: EntryPoint) -> tuple[bool, str, str]:
    """fedhet's own entry points first, so a plug-in reusing one of their names is the one
    skipped."""
    plugin = Plugin(entry)
    return not plugin.builtin, plugin.distribution, entry.name


def load_all(
    entries: Iterable[EntryPoint],
    register: Callable[[Plugin, Any], str | None],
    failures: dict[str, str],
) -> None:
    """Load each entry point and `register` the object it names (returning None, or the problem
    that keeps it out), each plug-in in isolation: one that fails is logged as one warning and
    recorded in `failures` under its entry point's name; the others load as ever."""
    for entry in entries:
        plugin = Plugin(entry)
        try:
            named = attempt([plugin], "cannot be loaded", entry.load)
            problem = attempt([plugin], "cannot be registered", register, plugin, named)
            if problem:
                raise PluginError(f"{plugin}: {problem}")
        except PluginError as failure:
            failures[entry.name] = str(failure)
            warn(failure, "skipped")


def warn(failure: PluginError, consequence: str) -> None:
    """The one warning a plug-in's failure costs (the CLI prints it as `warning: ...`)."""
    log.warning(f"{failure}; {consequence}")


def warned_by_parent() -> None:
    """In a worker process of a command: the command has warned of the plug-ins that failed."""
    log.setLevel(logging.ERROR)


def attempt(
    plugins: Sequence[Plugin],
    doing: str,
    function: Callable[..., Any],
    *args: Any,
    answers: tuple[type[BaseException], ...] = (),
) -> Any:
    """`function(*args)`, which runs the code of `plugins`: what it raises, but an interrupt and
    the `answers` (exceptions a plug-in may give as its answer), is a PluginError naming the
    plug-in whose code raised it (the first, when no frame of any is found), `doing` saying what
    failed. With no plugins (fedhet's own code) nothing is caught."""
    if not plugins:
        return function(*args)
    with _sigint_noted() as sigint:
        try:
            return function(*args)
        except (Interrupted, *answers):
            raise
        except BaseException as err:
            if isinstance(err, KeyboardInterrupt) and sigint:
                raise  # the user's Ctrl-C
            why = " ".join(str(err).split())
            said = f"{type(err).__name__}: {why}" if why else type(err).__name__
            raise PluginError(f"{_raiser(err, plugins)}: {doing}: {said}") from err


def answer(
    plugins: Sequence[Plugin], doing: str, block: Any, function: Callable[..., Any], *args: Any
) -> Any:
    """`function(*args)`, asking the code of `plugins` about a spec block (`block`, which their
    config validates or describes): a validation error or fedhet's own error is its answer;
    whatever else it raises is a validation error of the block naming the plug-in (the spec
    places it under the block's section)."""
    try:
        return attempt(plugins, doing, function, *args, answers=(ValidationError, FedhetError))
    except PluginError as failure:
        error = {"type": "value_error", "loc": (), "input": block, "ctx": {"error": failure}}
        raise ValidationError.from_exception_data("Spec", [error]) from failure.__cause__


def _raiser(err: BaseException, plugins: Sequence[Plugin]) -> Plugin:
    """The plug-in whose module holds the innermost frame of `err`'s traceback among theirs."""
    for frame, _ in reversed(list(traceback.walk_tb(err.__traceback__))):
        module = str(frame.f_globals.get("__name__", ""))
        for plugin in plugins:
            if module == plugin.package or module.startswith(plugin.package + "."):
                return plugin
    return plugins[0]


@contextmanager
def _sigint_noted() -> Iterator[list[int]]:
    """A list that gets the signal number if SIGINT arrives in the body (the handler in place
    still acts on it); only the main thread gets signals, so elsewhere none is noted."""
    noted: list[int] = []
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler) or threading.current_thread() is not threading.main_thread():
        yield noted
        return

    def note(signum: int, frame: Any) -> Any:
        noted.append(signum)
        return handler(signum, frame)

    signal.signal(signal.SIGINT, note)
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, handler)
