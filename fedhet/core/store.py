"""The artifact store: one Zarr v3 group per stage output at `<root>/<stage>/<key>.zarr`.

Writes go to a temporary sibling and are renamed into place when complete, so a reader never
sees a half-written artifact. A per-key lock file (`lockfile`, safe on NFS) keeps two processes,
on one machine or several sharing the store, from computing the same artifact at once. Long
stages keep resumable state in `<root>/<stage>/<key>.partial/`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
import traceback
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedhet import __version__
from fedhet.core import provenance
from fedhet.core.errors import DamagedArtifactError, InputError
from fedhet.process import interrupts, lockfile

if TYPE_CHECKING:  # imported where an array is read or written: zarr takes 0.15 s to import
    import zarr

TMP_MARK = ".tmp-"


def create_array(group: zarr.Group, name: str, **options: Any) -> zarr.Array:
    """`group.create_array(name, **options)` with zarr's crc32c checksum after the default
    compression, so that a damaged chunk fails to read: every array of the store (artifacts and
    checkpoints) is written here. Arrays written before carry none and read as before."""
    from zarr.codecs import Crc32cCodec, ZstdCodec

    return group.create_array(name, compressors=(ZstdCodec(), Crc32cCodec()), **options)


def damaged_array(error: BaseException) -> zarr.Array | None:
    """The array being read when `error` was raised, when `error` is zarr's checksum mismatch
    (raised by its Crc32cCodec, and the reading array found in the traceback); else None."""
    if not isinstance(error, ValueError):
        return None
    import zarr
    from zarr.codecs import Crc32cCodec

    owners = [frame.f_locals.get("self") for frame, _ in traceback.walk_tb(error.__traceback__)]
    if not owners or not isinstance(owners[-1], Crc32cCodec):
        return None
    readers = [owner for owner in owners if isinstance(owner, zarr.Array)]
    return readers[-1] if readers else None


def damaged(stage: str, key: str, what: str, why: str) -> DamagedArtifactError:
    """The one-line error for the damaged part `what` of an artifact, and what to do."""
    return DamagedArtifactError(
        f"{stage}/{key[:12]}: the stored {what} is damaged ({why}); see `fedhet artifacts "
        f"verify`, then `fedhet artifacts rm {key[:12]}` and recompute it"
    )


@contextmanager
def damage_named() -> Iterator[None]:
    """Turn a checksum mismatch read inside into a DamagedArtifactError naming the artifact
    (`stage/key`) and the array."""
    try:
        yield
    except ValueError as error:
        array = damaged_array(error)
        if array is None:
            raise
        where = Path(array.store.root)
        stage, key = where.parent.name, where.name.removesuffix(".zarr")
        raise damaged(stage, key, array.path, "checksum mismatch") from None


def default_root() -> Path:
    return Path(os.environ.get("FEDHET_STORE", "artifacts"))


def array_checksum(array: zarr.Array) -> str:
    """sha256 of an array's decoded contents, shape and dtype."""
    digest = hashlib.sha256(f"{array.shape}|{array.dtype}".encode())
    if array.ndim == 0 or array.shape[0] == 0:
        digest.update(np.ascontiguousarray(array[...]).tobytes())
        return digest.hexdigest()
    step = max(1, array.chunks[0])
    for start in range(0, array.shape[0], step):
        digest.update(np.ascontiguousarray(array[start : start + step]).tobytes())
    return digest.hexdigest()


def arrays(group: zarr.Group, prefix: str = "") -> Iterator[tuple[str, zarr.Array]]:
    """Every array of `group` and its subgroups, by path ("metrics/test_accuracy"), in order."""
    import zarr

    for name, member in sorted(group.members()):
        path = f"{prefix}{name}"
        if isinstance(member, zarr.Array):
            yield path, member
        else:
            yield from arrays(member, f"{path}/")


def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@dataclass(frozen=True)
class ArtifactInfo:
    stage: str
    key: str
    path: Path
    attrs: dict[str, Any]

    @property
    def size(self) -> int:
        return _dir_size(self.path)


class ArtifactStore:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else default_root()

    # --- paths --------------------------------------------------------------------------

    def path(self, stage: str, key: str) -> Path:
        return self.root / stage / f"{key}.zarr"

    def partial_dir(self, stage: str, key: str) -> Path:
        return self.root / stage / f"{key}.partial"

    def _lock_path(self, stage: str, key: str) -> Path:
        return self.root / stage / f"{key}.lock"

    def exists(self, stage: str, key: str) -> bool:
        return (self.path(stage, key) / "zarr.json").is_file()

    # --- reading ------------------------------------------------------------------------

    def open(self, stage: str, key: str) -> zarr.Group:
        import zarr

        with self._metadata(stage, key):
            return zarr.open_group(self.path(stage, key), mode="r")

    def attrs(self, stage: str, key: str) -> dict[str, Any]:
        """The artifact's attributes, as `open(stage, key).attrs` has them, read from its
        metadata file without zarr."""
        with self._metadata(stage, key):
            metadata = json.loads((self.path(stage, key) / "zarr.json").read_bytes())
            return metadata.get("attributes", {})

    @contextmanager
    def _metadata(self, stage: str, key: str) -> Iterator[None]:
        """Around reading a stored artifact's metadata: InputError when it is not stored, a
        DamagedArtifactError when its metadata does not parse."""
        if not self.exists(stage, key):
            raise InputError(f"no {stage} artifact {key[:12]} in {self.root}")
        try:
            yield
        except OSError:
            raise
        except Exception:  # metadata that does not parse, whatever zarr or json raised on it
            raise damaged(stage, key, "zarr.json", "unreadable metadata") from None

    def info(self, stage: str, key: str) -> ArtifactInfo:
        return ArtifactInfo(stage, key, self.path(stage, key), self.attrs(stage, key))

    def ls(self) -> list[ArtifactInfo]:
        found = []
        for entry in sorted(self.root.glob("*/*.zarr")):
            if TMP_MARK in entry.name or not (entry / "zarr.json").is_file():
                continue
            stage, key = entry.parent.name, entry.name.removesuffix(".zarr")
            try:
                found.append(self.info(stage, key))
            except Exception:  # corrupt metadata, whatever zarr raised: listed for `verify`
                found.append(ArtifactInfo(stage, key, entry, {}))
        return found

    def find(self, prefix: str) -> ArtifactInfo:
        """The artifact whose key starts with `prefix` (or `stage/prefix`)."""
        stage_filter, _, key_prefix = prefix.rpartition("/")
        matches = [
            a
            for a in self.ls()
            if a.key.startswith(key_prefix) and (not stage_filter or a.stage == stage_filter)
        ]
        if not matches:
            raise InputError(f"no artifact key starts with {prefix!r} in {self.root}")
        if len(matches) > 1:
            names = ", ".join(f"{a.stage}/{a.key[:12]}" for a in matches[:5])
            raise InputError(f"key prefix {prefix!r} is ambiguous ({names}); give more characters")
        return matches[0]

    # --- writing ------------------------------------------------------------------------

    @contextmanager
    def lock(self, stage: str, key: str) -> Iterator[lockfile.Lease]:
        """Hold the key's lock, waiting while a live owner holds it (a dead owner's goes stale
        and is taken over)."""
        with lockfile.acquire(self._lock_path(stage, key)) as lease:
            yield lease

    def try_lock(self, stage: str, key: str) -> lockfile.Lease | None:
        """The key's lock, or None while a live owner holds it."""
        return lockfile.try_acquire(self._lock_path(stage, key))

    def holder(self, stage: str, key: str) -> lockfile.Owner | None:
        """The live owner of the key's lock, if any."""
        return lockfile.holder(self._lock_path(stage, key))

    @contextmanager
    def write(self, stage: str, key: str, attrs: dict[str, Any]) -> Iterator[zarr.Group]:
        """Yield a fresh group in a temporary sibling; publish it atomically on success.

        The caller must hold `lock(stage, key)`. On an exception the temporary is removed.
        """
        import zarr

        final = self.path(stage, key)
        tmp = final.with_name(f"{final.name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        started = time.time()
        try:
            group = zarr.open_group(tmp, mode="w")
            yield group
            with interrupts.deferred():  # published whole, and then its checkpoints go
                group.attrs.update(
                    {
                        **attrs,
                        "stage": stage,
                        "key": key,
                        "fedhet_version": __version__,
                        # what the stage recorded of its environment (the train stage:
                        # its client executor), completed with the process's
                        "environment": provenance.environment()
                        | dict(group.attrs.get("environment", {})),
                        "created": datetime.now(UTC).isoformat(timespec="seconds"),
                        "wall_time_s": round(time.time() - started, 3),
                        "command": " ".join(sys.argv),
                        "checksums": {name: array_checksum(a) for name, a in arrays(group)},
                    }
                )
                os.rename(tmp, final)
                shutil.rmtree(self.partial_dir(stage, key), ignore_errors=True)
        finally:
            # an interrupted write may still have zarr I/O in flight: what lands later is a
            # dead writer's temporary, which `gc` removes
            shutil.rmtree(tmp, ignore_errors=True)

    # --- maintenance --------------------------------------------------------------------

    def verify(self, stage: str, key: str) -> list[str]:
        """Problems found by recomputing every array checksum; empty when intact."""
        import zarr

        try:
            group = zarr.open_group(self.path(stage, key), mode="r")
            expected = dict(group.attrs.get("checksums", {}))
            stored = dict(arrays(group))
        except Exception as err:  # unreadable metadata is corruption, whatever zarr raised
            return [f"unreadable: {err}"]
        problems = [f"{name}: array missing" for name in expected if name not in stored]
        for name, array in stored.items():
            if name not in expected:
                problems.append(f"{name}: no recorded checksum")
                continue
            try:
                actual = array_checksum(array)
            except Exception as err:  # a corrupt chunk fails its checksum, or to decode
                damage = "checksum mismatch" if damaged_array(err) else f"unreadable chunk ({err})"
                problems.append(f"{name}: {damage}")
                continue
            if actual != expected[name]:
                problems.append(f"{name}: checksum mismatch (stored data changed)")
        return problems

    def _unlocked(self, stage: str, key: str) -> bool:
        return self.holder(stage, key) is None

    def gc(self, dry_run: bool = False) -> list[Path]:
        """Remove dead writers' temporaries, checkpoints of published artifacts, stale locks;
        with `dry_run`, only say what would be removed."""
        removed = []
        for entry in sorted(self.root.glob("*/*")):
            stage = entry.parent.name
            name = entry.name
            if TMP_MARK in name:
                key = name.split(".zarr")[0]
                stale = self._unlocked(stage, key)
            elif name.endswith(".partial"):
                key = name.removesuffix(".partial")
                stale = self.exists(stage, key) and self._unlocked(stage, key)
            elif name.endswith(".lock"):
                key = name.removesuffix(".lock")
                stale = self._unlocked(stage, key)
            elif name.endswith(".zarr"):
                stale = not (entry / "zarr.json").is_file()
            else:
                stale = False
            if stale and not dry_run:
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            if stale:
                removed.append(entry)
        return removed

    # --- removal ------------------------------------------------------------------------

    def dependents(self, keys: set[str]) -> list[ArtifactInfo]:
        """Stored artifacts built, directly or through others, on any of `keys`."""
        stored = self.ls()
        found: dict[str, ArtifactInfo] = {}
        frontier = set(keys)
        while frontier:
            users = [
                a
                for a in stored
                if a.key not in found
                and a.key not in keys
                and frontier & set(a.attrs.get("upstream", {}).values())
            ]
            found |= {a.key: a for a in users}
            frontier = {a.key for a in users}
        return list(found.values())

    def remove(self, info: ArtifactInfo) -> None:
        """Delete an artifact and its checkpoint area, under its lock (`gc` removes the lock)."""
        with self.lock(info.stage, info.key):
            shutil.rmtree(info.path, ignore_errors=True)
            shutil.rmtree(self.partial_dir(info.stage, info.key), ignore_errors=True)
