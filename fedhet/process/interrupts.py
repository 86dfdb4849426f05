"""SIGINT and SIGTERM as the `Interrupted` exception, held back while a short section that must
finish (publishing an artifact, saving a checkpoint) runs: the signal then arrives right after it.

The command line installs `handle` for both signals; library code marks such sections with
`deferred()`. Without the handler installed (fedhet used as a library), `deferred` changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class Interrupted(BaseException):  # noqa: N818 (not an error: the user asked to stop)
    """SIGINT or SIGTERM arrived. A BaseException, so no `except Exception` swallows it; the
    stage that is running saves its checkpoint and adds where it stopped to `where`."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.exit_code = 128 + signum
        self.where = ""  # e.g. "at round 3 of 20 (train 1a2b3c4d5e6f)"
        self.stage = ""  # the stage and short key it stopped in, set once by the innermost

    def in_stage(self, stage: str) -> None:
        """Record the stage (and key) that was running, unless an inner stage already did."""
        if not self.stage:
            self.stage = stage
            self.where = f"{self.where} ({stage})" if self.where else f"in {stage}"

    def __str__(self) -> str:
        where = f" {self.where}" if self.where else ""
        return f"interrupted{where}; run the same command to resume"


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
