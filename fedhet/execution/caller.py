"""Who a session (fedhet.session) speaks to: the `Voice` its messages are worded in (the command
line's options and commands, or the Python API's arguments and calls) and a view of a sweep
that shows nothing, for callers that read the returned rows instead."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, Literal, Protocol

Recomputer = Literal["train", "tune"]  # the command that computes a removed artifact again


class Wording(Protocol):
    """How a message names an argument: the command line's options, or the Python API's
    arguments (all that a store's session, fedhet.store_session, says)."""

    def option(self, name: str) -> str:
        """An argument by its name: `--tensorboard` or `tensorboard`."""
        ...

    def setting(self, name: str, value: object) -> str:
        """An argument as given: `--jobs 0` or `jobs=0`."""
        ...

    def flag(self, name: str) -> str:
        """A yes-or-no argument turned on: `--cascade` or `cascade=True`."""
        ...


class Voice(Wording, Protocol):
    """How a message names what the caller can change or do next: the command line's options
    and commands, or the Python API's arguments and calls."""

    def train_first(self, reader: str) -> str:
        """How to store the runs `reader` (a command or method) needs."""
        ...

    def tune_first(self) -> str:
        """How to store the spec's tune."""
        ...

    def train_tuned(self) -> str:
        """How to store the runs of the configurations a tune chose."""
        ...

    def recompute(self, key: str, cascade: bool, command: Recomputer) -> str:
        """How to compute again the damaged stored artifact `key`: remove it (with `cascade`,
        and what is built on it), then run the spec's `command`."""
        ...


def removal(key: str, cascade: bool, store: list[str]) -> str:
    """The `fedhet artifacts rm` command that removes `key` (with --cascade, what is built on
    it too: rm refuses otherwise) from the store that the options `store` name."""
    return shlex.join(
        ["fedhet", "artifacts", "rm", key, *(["--cascade"] if cascade else []), *store]
    )


@dataclass(frozen=True)
class QuietView:
    """A sweep's view that shows nothing (a notebook reads the returned table instead)."""

    runs: list[Any]

    def on_change(self, state: Any) -> None:
        return None

    def on_progress(self, *event: Any) -> None:
        return None

    def __enter__(self) -> QuietView:
        return self

    def __exit__(self, *exc: object) -> None:
        return None
