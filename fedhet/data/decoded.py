"""A cache of decoded data files: a compressed source (e.g. Fashion-MNIST's gzipped IDX files)
is decoded once and kept as a .npy file, so a later process loads it without decoding again.

An entry is named by the source's resolved path, size and modification time: a changed source
is decoded anew. The folder is $FEDHET_CACHE, else $XDG_CACHE_HOME/fedhet, else
~/.cache/fedhet; where it cannot be written, sources are decoded every time.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedhet.core.cache import cache_folder


def entry(source: Path) -> Path:
    """Where `source`'s decoded array is kept."""
    resolved = source.resolve()
    stat = resolved.stat()
    name = f"{resolved}|{stat.st_size}|{stat.st_mtime_ns}"
    digest = hashlib.sha256(name.encode()).hexdigest()[:24]
    return cache_folder() / "decoded" / f"{resolved.name}-{digest}.npy"


def decoded(source: Path, decode: Callable[[Path], np.ndarray]) -> np.ndarray:
    """`decode(source)`, from the cache when it holds this version of `source`."""
    kept = entry(source)
    try:
        return np.load(kept, allow_pickle=False)
    except (OSError, ValueError):  # absent, or a damaged entry: decode again
        pass
    array = decode(source)
    partial = kept.with_name(f"{kept.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        with open(partial, "wb") as f:
            np.save(f, array, allow_pickle=False)
        os.replace(partial, kept)  # readers never see a half-written entry
    except OSError:  # a read-only cache, a full disk: decode every time
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
    return array
