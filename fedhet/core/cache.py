"""fedhet's cache folder on this machine ($FEDHET_CACHE, else $XDG_CACHE_HOME/fedhet, else
~/.cache/fedhet): what is slow to compute and never changes for a given input (decoded datasets,
the facts of an installed torch build on this CPU)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def cache_folder() -> Path:
    if os.environ.get("FEDHET_CACHE"):
        return Path(os.environ["FEDHET_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fedhet"


def cached_json(name: str, key: str, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`compute()`, kept in the cache under `name` and a digest of `key`: computed again when
    the file is missing or unreadable, and not kept when the cache cannot be written."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    path = cache_folder() / name / f"{digest}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    value = compute()
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps(value))
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)
    return value
