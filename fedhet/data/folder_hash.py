"""A data folder's files as fedhet keys them: their stamp (each file's name, size and
modification time: what tells a changed file, so a cached read is redone) and their content
hash (the data's identity in the keys: each file's path relative to the folder and its bytes,
in sorted order; a changed byte changes it, a moved folder does not). LEAF folders and Hugging
Face datasets are keyed so; an image folder hashes its own way (fedhet.data.image_folder)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

Stamp = tuple[tuple[str, int, int], ...]


def stamp(files: Iterable[Path]) -> Stamp:
    """Each file's name, size and modification time, in the order given."""
    stats = ((str(f), f.stat()) for f in files)
    return tuple((name, stat.st_size, stat.st_mtime_ns) for name, stat in stats)


class ContentHash:
    """The sha256 of files under `root`, added one by one as they are read."""

    def __init__(self, root: Path):
        self.root = root
        self._sha256 = hashlib.sha256()

    def relative(self, name: str) -> str:
        """The file's path under the root, as the hash names it ('/' on every system)."""
        return Path(name).relative_to(self.root).as_posix()

    def add(self, name: str, content: bytes) -> None:
        self._sha256.update(self.relative(name).encode() + b"\0" + content + b"\0")

    def hexdigest(self) -> str:
        return self._sha256.hexdigest()
