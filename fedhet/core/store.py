"""The artifact store: one sealed Zarr v3 group (fedhet.core.sealed) per stage output at
`<root>/<stage>/<key>.zarr`.

Writes go to a temporary sibling and are renamed into place when complete, so a reader never
sees a half-written artifact. A per-key lock file (`lockfile`, safe on NFS) keeps two processes,
on one machine or several sharing the store, from computing the same artifact at once. Long
stages keep resumable state in `<root>/<stage>/<key>.partial/`.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedhet import __version__
from fedhet.core import object_gc, object_locks, provenance
from fedhet.core.errors import InputError
from fedhet.core.object_partial import PartialMirror
from fedhet.core.object_store import remote_for
from fedhet.core.sealed import (
    CHECKSUMS,
    array_checksum,
    arrays,
    check_attributes,
    member_problems,
    open_sealed,
    parsing,
    seal,
    stored_attributes,
)
from fedhet.process import interrupts, lockfile

if TYPE_CHECKING:  # imported where an array is read or written: zarr takes 0.15 s to import
    import zarr

TMP_MARK = ".tmp-"
GRACE_S = 3600.0  # `gc`: how long a writer's uncommitted files on an object store are left alone


def default_root() -> str:
    """The store's folder or URL: FEDHET_STORE, else `artifacts`."""
    return os.environ.get("FEDHET_STORE", "artifacts")


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
    """A folder of artifacts, or an object store (`s3://...`, see fedhet.core.object_store)
    read and written through its local copy `root`."""

    def __init__(self, root: str | Path | None = None):
        where = root if root is not None else default_root()
        self.remote = remote_for(where)
        if self.remote is not None:
            self.remote.check()
        self.root = self.remote.cache if self.remote is not None else Path(where)
        # where the store is, as users see it (a URL carries no credentials)
        self.location = self.remote.url if self.remote is not None else str(self.root)

    def address(self) -> str:
        """What gives this store to another process: its URL, or its folder's absolute path."""
        return self.location if self.remote is not None else str(self.root.resolve())

    # --- paths --------------------------------------------------------------------------

    def path(self, stage: str, key: str) -> Path:
        return self.root / stage / f"{key}.zarr"

    def partial_dir(self, stage: str, key: str) -> Path:
        return self.root / stage / f"{key}.partial"

    def _lock_path(self, stage: str, key: str) -> Path:
        return self.root / stage / f"{key}.lock"

    def exists(self, stage: str, key: str) -> bool:
        """Whether the artifact is stored (an object store's is fetched into `root`)."""
        if (self.path(stage, key) / "zarr.json").is_file():
            return True
        return self.remote is not None and self.remote.fetch(stage, key, self.path(stage, key))

    # --- reading ------------------------------------------------------------------------

    def open(self, stage: str, key: str) -> zarr.Group:
        with self._metadata(stage, key):
            return open_sealed(self.path(stage, key))

    def attrs(self, stage: str, key: str) -> dict[str, Any]:
        """The artifact's attributes, as `open(stage, key).attrs` has them (checked), read
        from its metadata file without zarr."""
        with self._metadata(stage, key):
            folder = self.path(stage, key)
            return check_attributes(folder, stored_attributes(folder))

    @contextmanager
    def _metadata(self, stage: str, key: str) -> Iterator[None]:
        """Around reading a stored artifact's metadata: InputError when it is not stored, a
        DamagedArtifactError when its metadata does not parse."""
        if not self.exists(stage, key):
            raise InputError(f"no {stage} artifact {key[:12]} in {self.location}")
        with parsing(self.path(stage, key)):
            yield

    def info(self, stage: str, key: str) -> ArtifactInfo:
        return ArtifactInfo(stage, key, self.path(stage, key), self.attrs(stage, key))

    def ls(self) -> list[ArtifactInfo]:
        found = []
        committed = None if self.remote is None else self.remote.committed()
        for stage, key in committed or []:
            self.exists(stage, key)
        for entry in sorted(self.root.glob("*/*.zarr")):
            if committed is not None and (entry.parent.name, entry.stem) not in committed:
                continue  # a local copy of an artifact removed from the object store
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
            raise InputError(f"no artifact key starts with {prefix!r} in {self.location}")
        if len(matches) > 1:
            names = ", ".join(f"{a.stage}/{a.key[:12]}" for a in matches[:5])
            raise InputError(f"key prefix {prefix!r} is ambiguous ({names}); give more characters")
        return matches[0]

    # --- writing ------------------------------------------------------------------------

    @contextmanager
    def lock(self, stage: str, key: str) -> Iterator[lockfile.Lease]:
        """Hold the key's lock, waiting while a live owner holds it (a dead owner's goes stale
        and is taken over)."""
        while (lease := self.try_lock(stage, key)) is None:
            time.sleep(0.2)
        with lease:
            yield lease

    def try_lock(self, stage: str, key: str) -> lockfile.Lease | None:
        """The key's lock, or None while a live owner holds it. On an object store the lock
        object is held too, and the key's checkpoint area is kept in step with the server's
        (fedhet.core.object_partial) until the lock is released."""
        lease = lockfile.try_acquire(self._lock_path(stage, key))
        if lease is None or self.remote is None:
            return lease
        try:
            remote = object_locks.try_lock(self.remote, stage, key)
        except BaseException:
            lease.release()
            raise
        if remote is None:
            lease.release()
            return None
        try:
            mirror = PartialMirror(self.remote, stage, key, self.partial_dir(stage, key))
        except BaseException:
            remote.release()
            lease.release()
            raise
        lease.also_release(mirror.stop)
        lease.also_release(remote.release)
        lease.took_over = lease.took_over or remote.took_over
        return lease

    def drop_stale_lock(self, stage: str, key: str) -> None:
        """Remove the lock a dead writer left on a stored artifact (killed between publishing
        it and unlocking); a live owner's lock stays."""
        path = self._lock_path(stage, key)
        try:
            if path.exists() and (lease := lockfile.try_acquire(path)) is not None:
                lease.release()
        except OSError:  # a store this user may read but not write: its reader leaves it
            pass

    def holder(self, stage: str, key: str) -> lockfile.Owner | None:
        """The live owner of the key's lock, if any."""
        local = lockfile.holder(self._lock_path(stage, key))
        if local is not None or self.remote is None:
            return local
        return object_locks.holder(self.remote, stage, key)

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
                group.update_attributes(  # one metadata write, not one per key
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
                        CHECKSUMS: {name: array_checksum(a) for name, a in arrays(group)},
                    }
                )
                seal(group)
                self._publish(tmp, stage, key)
        finally:
            # an interrupted write may still have zarr I/O in flight: what lands later is a
            # dead writer's temporary, which `gc` removes
            shutil.rmtree(tmp, ignore_errors=True)

    def _publish(self, tmp: Path, stage: str, key: str) -> None:
        """Publish the complete group in the temporary sibling `tmp`, then drop its checkpoints."""
        if self.remote is not None:  # committed there before it is here
            self.remote.publish(tmp, stage, key)
        os.rename(tmp, self.path(stage, key))
        shutil.rmtree(self.partial_dir(stage, key), ignore_errors=True)

    def adopt(self, folder: Path, stage: str, key: str) -> None:
        """Publish a copy of the sealed artifact in `folder` (of another store), bit for bit.
        The caller must hold `lock(stage, key)`."""
        final = self.path(stage, key)
        tmp = final.with_name(f"{final.name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            shutil.copytree(folder, tmp)
            with interrupts.deferred():
                self._publish(tmp, stage, key)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    # --- maintenance --------------------------------------------------------------------

    def verify(self, stage: str, key: str, decode: bool = True) -> list[str]:
        """Problems found by recomputing every checksum, or without `decode` every checksum
        but the decoded arrays' (see `member_problems`); empty when intact."""
        found = member_problems(self.path(stage, key), decode)
        return [f"{member}: {why}" for member, why in found]

    def _unlocked(self, stage: str, key: str) -> bool:
        return self.holder(stage, key) is None

    def gc(self, dry_run: bool = False, grace_s: float = GRACE_S) -> list[str]:
        """Remove dead writers' temporaries, checkpoints of published artifacts, stale locks,
        and on an object store what dead writers left on the server (fedhet.core.object_gc:
        uncommitted files older than `grace_s`); with `dry_run`, only say what would be
        removed. The locations removed."""
        removed = []
        for entry in sorted(self.root.glob("*/*")):
            if self._stale(entry):
                removed.append(str(entry))
                if not dry_run:
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        if self.remote is not None:
            removed += object_gc.collect(self.remote, grace_s, dry_run)
        return removed

    def _stale(self, entry: Path) -> bool:
        """Whether `entry` of the store's folder is a leftover `gc` removes."""
        stage, name = entry.parent.name, entry.name
        if TMP_MARK in name:
            return self._unlocked(stage, name.split(".zarr")[0])
        if name.endswith(".partial"):
            key = name.removesuffix(".partial")
            return self.exists(stage, key) and self._unlocked(stage, key)
        if name.endswith(".lock"):
            return self._unlocked(stage, name.removesuffix(".lock"))
        if name.endswith(".zarr"):
            return not (entry / "zarr.json").is_file()
        return False

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
            if self.remote is not None:
                self.remote.remove(info.stage, info.key)
            shutil.rmtree(info.path, ignore_errors=True)
            shutil.rmtree(self.partial_dir(info.stage, info.key), ignore_errors=True)
