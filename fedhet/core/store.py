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
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedhet import __version__
from fedhet.core import provenance
from fedhet.core.errors import DamagedArtifactError, FedhetError, InputError
from fedhet.core.object_store import remote_for
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

    owners = _owners(error)
    if not owners or not isinstance(owners[-1], Crc32cCodec):
        return None
    readers = [owner for owner in owners if isinstance(owner, zarr.Array)]
    return readers[-1] if readers else None


def _owners(error: BaseException) -> list[Any]:
    """The objects whose methods were running when `error` was raised, outermost first."""
    return [frame.f_locals.get("self") for frame, _ in traceback.walk_tb(error.__traceback__)]


def damaged(stage: str, key: str, what: str, why: str) -> DamagedArtifactError:
    """The one-line error for the damaged part `what` of an artifact, and what to do."""
    return DamagedArtifactError(
        f"{stage}/{key[:12]}: the stored {what} is damaged ({why}); see `fedhet artifacts "
        f"verify`, then `fedhet artifacts rm {key[:12]}` and recompute it"
    )


class DamagedMember(DamagedArtifactError):
    """A damaged part of the stored group in `folder` (an artifact, or a checkpoint in its
    partial area): `member`, an array's or group's path ("zarr.json": the group's own
    metadata), and `why`."""

    def __init__(self, folder: Path, member: str, why: str):
        stage, key, inside = _artifact_of(folder)
        super().__init__(str(damaged(stage, key, f"{inside}{member}", why)))
        self.folder, self.member, self.why = folder, member, why

    def __reduce__(self):  # travels back from a worker process whole
        return type(self), (self.folder, self.member, self.why)


def _artifact_of(folder: Path) -> tuple[str, str, str]:
    """(stage, key, what inside it) of a stored group: `<stage>/<key>.zarr`, or a checkpoint
    `<stage>/<key>.partial/<name>`."""
    if folder.parent.name.endswith(".partial"):
        key = folder.parent.name.removesuffix(".partial")
        return folder.parent.parent.name, key, f"checkpoint {folder.name}/"
    return folder.parent.name, folder.name.split(".zarr")[0], ""


def damage_in(error: BaseException) -> DamagedMember | None:
    """What `error` says of stored data: the damaged member of a stored group when `error` was
    raised reading one (a chunk failing its checksum, metadata missing, changed or that zarr
    cannot read), else None (a failure of something else)."""
    if isinstance(error, DamagedMember):
        return error
    array = damaged_array(error)
    if array is not None:
        return DamagedMember(Path(array.store.root), array.path, "checksum mismatch")
    if isinstance(error, FedhetError | OSError | MemoryError) or not _raised_in_zarr(error):
        return None
    from fedhet.core.checked_store import CheckedStore

    stores = [owner.store for owner in _owners(error) if isinstance(owner, _zarr_nodes())]
    for folder in sorted({Path(s.root) for s in stores if isinstance(s, CheckedStore)}):
        problems = member_problems(folder)  # which member zarr failed on, and how
        if problems:
            return DamagedMember(folder, *problems[0])
    return None


def _raised_in_zarr(error: BaseException) -> bool:
    """Whether zarr's code was running when `error` was raised (told without touching the
    frames' locals, which a diverged stage's error must not keep alive)."""
    files = (frame.f_code.co_filename for frame, _ in traceback.walk_tb(error.__traceback__))
    return any(f"{os.sep}zarr{os.sep}" in name for name in files)


def _zarr_nodes() -> tuple[type, ...]:
    import zarr
    from zarr.core.array import AsyncArray
    from zarr.core.group import AsyncGroup

    return (zarr.Array, zarr.Group, AsyncArray, AsyncGroup)


@contextmanager
def damage_named() -> Iterator[None]:
    """Turn a failure to read stored data inside (a chunk failing its checksum, an array's or
    group's metadata missing, changed or unreadable) into a DamagedArtifactError naming the
    artifact (`stage/key`) and the member."""
    try:
        yield
    except Exception as error:
        damage = damage_in(error)
        if damage is None or damage is error:
            raise
        raise damage from None


# --- the checksums of a stored group ----------------------------------------------------------

CHECKSUMS = "checksums"  # per array: sha256 of its contents (`array_checksum`), for `verify`
METADATA_CHECKSUMS = "metadata_checksums"  # per member: sha256 of its zarr.json, every read
ATTRIBUTES_CHECKSUM = "attributes_checksum"  # sha256 of the other attributes, every read
INTEGRITY = (CHECKSUMS, METADATA_CHECKSUMS, ATTRIBUTES_CHECKSUM)


def json_checksum(value: Any) -> str:
    """sha256 of the canonical JSON of `value`: sorted keys, no whitespace, floats as Python
    writes them (so the same after a JSON round trip)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def attributes_checksum(attrs: dict[str, Any]) -> str:
    """The `json_checksum` of `attrs` less their own checksum."""
    return json_checksum({name: v for name, v in attrs.items() if name != ATTRIBUTES_CHECKSUM})


def metadata_checksums(folder: Path) -> dict[str, str]:
    """sha256 of the metadata file of every member (array or group) of the group in `folder`."""
    return {
        found.parent.relative_to(folder).as_posix(): hashlib.sha256(found.read_bytes()).hexdigest()
        for found in sorted(folder.rglob("zarr.json"))
        if found.parent != folder
    }


def _stored_attributes(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "zarr.json").read_bytes()).get("attributes", {})


def seal(group: zarr.Group) -> None:
    """Record, in the attributes of the complete `group` (a root), the checksum of each member's
    metadata, then of its attributes: a later read of a member or of an attribute checks it."""
    folder = Path(group.store.root)
    group.attrs[METADATA_CHECKSUMS] = metadata_checksums(folder)
    group.attrs[ATTRIBUTES_CHECKSUM] = attributes_checksum(_stored_attributes(folder))


def check_attributes(folder: Path, attrs: dict[str, Any]) -> dict[str, Any]:
    """`attrs`, read from the group in `folder`; DamagedMember when they fail their checksum
    (a group sealed before this check carries none and reads as before)."""
    recorded = attrs.get(ATTRIBUTES_CHECKSUM)
    if recorded is not None and recorded != attributes_checksum(attrs):
        raise DamagedMember(folder, "zarr.json", "its attributes fail their checksum")
    return attrs


@contextmanager
def parsing(folder: Path) -> Iterator[None]:
    """Around reading the metadata of the group in `folder`: what does not parse, whatever json
    or zarr raised on it, is a DamagedMember."""
    try:
        yield
    except (OSError, DamagedArtifactError):
        raise
    except Exception:
        raise DamagedMember(folder, "zarr.json", "unreadable metadata") from None


def open_sealed(folder: Path) -> zarr.Group:
    """The stored group in `folder`, read-only, its attributes checked; reading a member then
    checks the member's metadata against the checksum recorded when it was sealed."""
    import zarr
    from zarr.storage import LocalStore

    from fedhet.core.checked_store import CheckedStore

    with parsing(folder):
        attrs = _stored_attributes(folder)
    recorded = attrs.get(METADATA_CHECKSUMS)
    if recorded is None:  # sealed before metadata checksums: its arrays must be there
        recorded = dict.fromkeys(attrs.get(CHECKSUMS, {}))
    files = LocalStore(folder, read_only=True)
    with parsing(folder):
        group = zarr.open_group(
            store=CheckedStore(files, recorded, partial(DamagedMember, folder)), mode="r"
        )
    check_attributes(folder, attrs)
    return group


def default_root() -> str:
    """The store's folder or URL: FEDHET_STORE, else `artifacts`."""
    return os.environ.get("FEDHET_STORE", "artifacts")


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


def member_problems(folder: Path) -> list[tuple[str, str]]:
    """Every damaged part of the stored group in `folder`, as (member, why), found by
    recomputing its checksums: its attributes; each member's metadata (missing, changed or
    unreadable); each array's contents (a chunk failing its crc32c, or the array its sha256)."""
    try:
        attrs = _stored_attributes(folder)
    except Exception:  # unreadable metadata is damage, whatever json raised on it
        return [("zarr.json", "unreadable metadata")]
    problems = []
    if attrs.get(ATTRIBUTES_CHECKSUM, attributes_checksum(attrs)) != attributes_checksum(attrs):
        problems.append(("zarr.json", "its attributes fail their checksum"))
    recorded, found = attrs.get(METADATA_CHECKSUMS, {}), metadata_checksums(folder)
    contents = attrs.get(CHECKSUMS)  # None: a checkpoint, its arrays checked by their crc32c
    for member in sorted(set(recorded) | set(contents or {}) | set(found)):
        if member not in found:
            why = "metadata missing" if (folder / member).is_dir() else "missing"
        elif recorded.get(member, found[member]) != found[member]:
            why = "metadata changed: checksum mismatch"
        else:
            why = _contents_problem(folder, member, contents)
        if why is not None:
            problems.append((member, why))
    return problems


def _contents_problem(folder: Path, member: str, contents: dict[str, str] | None) -> str | None:
    """What is wrong with `member` of the group in `folder`, its metadata being as sealed."""
    import zarr

    try:
        node = zarr.open(folder / member, mode="r")
    except Exception:  # metadata zarr cannot read, whatever it raised
        return "unreadable metadata"
    if not isinstance(node, zarr.Array):
        return None
    if contents is not None and member not in contents:
        return "no recorded checksum"
    try:
        actual = array_checksum(node)
    except Exception as err:  # a corrupt chunk fails its checksum, or to decode
        return "checksum mismatch" if damaged_array(err) else f"unreadable chunk ({err})"
    if contents is not None and actual != contents[member]:
        return "checksum mismatch (stored data changed)"
    return None


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
            return check_attributes(folder, _stored_attributes(folder))

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
        """The key's lock, or None while a live owner holds it; an object store's lock is
        held too, released with the local one."""
        lease = lockfile.try_acquire(self._lock_path(stage, key))
        if lease is None or self.remote is None:
            return lease
        remote = self.remote.try_lock(stage, key)
        if remote is None:
            lease.release()
            return None
        lease.also_release(remote.release)
        return lease

    def holder(self, stage: str, key: str) -> lockfile.Owner | None:
        """The live owner of the key's lock, if any."""
        local = lockfile.holder(self._lock_path(stage, key))
        if local is not None or self.remote is None:
            return local
        return self.remote.holder(stage, key)

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

    def verify(self, stage: str, key: str) -> list[str]:
        """Problems found by recomputing every checksum (see `member_problems`); empty when
        intact."""
        return [f"{member}: {why}" for member, why in member_problems(self.path(stage, key))]

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
            if self.remote is not None:
                self.remote.remove(info.stage, info.key)
            shutil.rmtree(info.path, ignore_errors=True)
            shutil.rmtree(self.partial_dir(info.stage, info.key), ignore_errors=True)
