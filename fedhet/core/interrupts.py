"""SIGINT and SIGTERM as the `Interrupted` exception, held back while a short section that must
finish (publishing an artifact, saving a checkpoint) runs: the signal then arrives right after it.

The command line installs `handle` for both signals; library code marks such sections with
`deferred()`. Without the handler installed (fedhet used as a library), `deferred` changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fedhet.core.errors import Interrupted

_depth = 0
_pending: int | None = None


def handle(signum: int, frame: object) -> None:
    """The signal handler: raise `Interrupted` now, or when the current deferred section ends."""
    global _pending
    if _depth:
        _pending = _pending or signum
        return
    raise Interrupted(signum)


@contextmanager
def deferred() -> Iterator[None]:
    """Run the body to its end even if SIGINT/SIGTERM arrives; raise `Interrupted` after it."""
    global _depth, _pending
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _pending is not None:
            signum, _pending = _pending, None
            raise Interrupted(signum)  # noqa: B012 (the user's stop outranks the body's outcome)
