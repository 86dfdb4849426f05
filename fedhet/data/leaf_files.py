"""A LEAF data folder read as it is stored: `train/` and `test/`, each holding JSON files of

    {"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}

as LEAF's preprocessing scripts (github.com/TalwalkarLab/leaf, `preprocess.sh`) write them. Every
file is checked as it is read: a file that is not such a JSON object, a user whose `x` and `y`
differ in length (or disagree with `num_samples`), or a user in two files of one split is refused
in one line naming the file. The files' relative paths and bytes, in sorted order, are hashed
into one content hash (the key's), so a changed byte changes the key and a moved folder does not.

A folder is read once per process and content (cached by its files' names, sizes and mtimes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from fedhet.core.errors import InputError
from fedhet.data.folder_hash import ContentHash, Stamp, stamp

SPLITS = ("train", "test")
DOWNLOAD_HINT = (
    "LEAF's preprocessing writes it (github.com/TalwalkarLab/leaf: data/<task>/preprocess.sh; "
    "docs/how-to/leaf.md says how)"
)

Samples = tuple[list[Any], list[Any]]  # a user's (x, y)


@dataclass(frozen=True, eq=False)
class LeafFolder:
    train: dict[str, Samples]  # user -> samples, users in the order the files give them
    test: dict[str, Samples]
    sha256: str


def read_folder(path: str) -> LeafFolder:
    """The checked users of the LEAF folder at `path` (relative to the working directory);
    InputError naming the folder or file and what to fix."""
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise InputError(f"{path}: folder not found (looked in {Path.cwd()}); {DOWNLOAD_HINT}")
    files: list[Path] = []
    for split in SPLITS:
        found = sorted((root / split).glob("*.json")) if (root / split).is_dir() else []
        if not found:
            raise InputError(
                f"{path}: no {split}/*.json files; give a LEAF data folder (train/ and test/ "
                f"of JSON files): {DOWNLOAD_HINT}"
            )
        files += found
    return _read(root, stamp(files), path)


@lru_cache(maxsize=2)
def _read(root: Path, files: Stamp, path: str) -> LeafFolder:
    content_hash = ContentHash(root)
    splits: dict[str, dict[str, Samples]] = {split: {} for split in SPLITS}
    for name, _, _ in files:
        relative = content_hash.relative(name)
        where = f"{path}/{relative}"
        try:
            content = Path(name).read_bytes()
        except OSError as err:
            raise InputError(f"{where}: cannot be read ({err.strerror}); check the file") from None
        content_hash.add(name, content)
        users = splits[relative.partition("/")[0]]
        for user, samples in _users(content, where).items():
            if user in users:
                raise InputError(f"{where}: user {user!r} again (an earlier file has it)")
            users[user] = samples
    return LeafFolder(splits["train"], splits["test"], content_hash.hexdigest())


def _users(content: bytes, where: str) -> dict[str, Samples]:
    try:
        document = json.loads(content)
    except (ValueError, UnicodeDecodeError) as err:
        raise InputError(f"{where}: not valid JSON ({err}); write the file again") from None
    if not isinstance(document, dict) or not isinstance(document.get("user_data"), dict):
        raise InputError(
            f"{where}: no user_data object; a LEAF file holds users, num_samples and user_data"
        )
    data, counts = document["user_data"], document.get("num_samples")
    listed = document.get("users", list(data))
    if not isinstance(listed, list) or sorted(map(str, listed)) != sorted(data):
        raise InputError(f"{where}: users does not list the users of user_data; fix the file")
    if counts is not None and (not isinstance(counts, list) or len(counts) != len(listed)):
        raise InputError(f"{where}: num_samples does not give one count per user; fix the file")
    users = {}
    for i, user in enumerate(map(str, listed)):
        samples = data[user]
        x = samples.get("x") if isinstance(samples, dict) else None
        y = samples.get("y") if isinstance(samples, dict) else None
        if not isinstance(x, list) or not isinstance(y, list) or len(x) != len(y):
            raise InputError(f"{where}: user {user!r} has no x and y lists of equal length")
        if counts is not None and counts[i] != len(y):
            raise InputError(
                f"{where}: user {user!r} has {len(y)} samples, num_samples says {counts[i]}"
            )
        users[user] = (x, y)
    return users
