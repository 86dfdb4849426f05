"""Unexpected exceptions: one line for the user, the full traceback in a file for the bug report."""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from pathlib import Path


def _origin(exc: BaseException) -> str:
    """file:line (function) of the innermost frame inside fedhet, else the innermost frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if f"{os.sep}fedhet{os.sep}" in f.filename] or frames
    if not ours:
        return "unknown place"
    frame = ours[-1]
    return f"{Path(frame.filename).name}:{frame.lineno} ({frame.name})"


def report(exc: BaseException, debug: bool = False) -> str:
    """Write the traceback to a file (and stderr when `debug`); return the one-line message."""
    text = "".join(traceback.format_exception(exc))
    if debug:
        print(text, end="", file=__import__("sys").stderr)
    name = f"fedhet-crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
    path = Path(os.environ.get("FEDHET_CRASH_DIR", tempfile.gettempdir())) / name
    try:
        path.write_text(text)
        where = f"full traceback in {path}"
    except OSError:
        where = "the traceback could not be written; rerun with --debug"
    message = " ".join(str(exc).split()) or "(no message)"
    return f"error: unexpected {type(exc).__name__} at {_origin(exc)}: {message}; {where}" + (
        "" if debug else " (or rerun with --debug)"
    )
