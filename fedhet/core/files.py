"""Files the commands write outside the store (reports, figures, exported tables): each one
complete or not at all, and a write that fails, a full disk above all, said in one line."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from fedhet.core.errors import RunError


def write_atomically(path: Path, data: bytes) -> None:
    """`data` as the file `path`, through a temporary sibling renamed into place; RunError naming
    `path` when it cannot be written (the temporary is removed, `path` is left as it was)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_bytes(data)
        os.replace(temporary, path)
    except OSError as error:
        full = error.errno in (errno.ENOSPC, errno.EDQUOT)
        fix = "free some space" if full else "choose another folder"
        raise RunError(
            f"cannot write {path} ({error.strerror}); {fix} and run the same command"
        ) from None
    finally:
        temporary.unlink(missing_ok=True)
