"""`fedhet artifacts gc` on an object store's server: what dead writers left behind.

Removed: a lock object whose owner is dead (`lockfile.is_live`); the files of an artifact without
its commit marker (a writer that died before it); the files under a committed artifact that its
marker does not list; the checkpoint area of a committed artifact; a checkpoint without its
marker; a probe of conditional writes. Never a committed artifact's listed files or marker,
nothing of a key whose lock is held by a live owner, and nothing uncommitted newer than `grace_s`
seconds (a writer may be at work on it)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fedhet.core import object_locks
from fedhet.core.object_store import COMMIT, PROBE, ObjectStore
from fedhet.process import lockfile

if TYPE_CHECKING:
    from obstore import ObjectMeta


@dataclass
class _Group:
    """The objects under one name: an artifact (`stage/key.zarr`), a checkpoint area
    (`stage/key.partial`) or a checkpoint in one (`stage/key.partial/ckpt-...`)."""

    stage: str
    key: str
    paths: list[str] = field(default_factory=list)
    newest: float = 0.0


def _groups(objects: list[ObjectMeta]) -> dict[str, _Group]:
    found: dict[str, _Group] = {}

    def add(name: str, stage: str, key: str, path: str, modified: float) -> None:
        group = found.setdefault(name, _Group(stage, key))
        group.paths.append(path)
        group.newest = max(group.newest, modified)

    for meta in objects:
        path, modified = meta["path"], meta["last_modified"].timestamp()
        stage, _, rest = path.partition("/")
        top, _, inside = rest.partition("/")
        key, _, kind = top.partition(".")
        if not inside or kind not in ("zarr", "partial"):  # an artifact's marker, a lock, ...
            continue
        add(f"{stage}/{top}", stage, key, path, modified)
        if kind == "partial" and "/" in inside:  # a file of a checkpoint (a group)
            add(f"{stage}/{top}/{inside.split('/')[0]}", stage, key, path, modified)
    return found


def collect(remote: ObjectStore, grace_s: float, dry_run: bool = False) -> list[str]:
    """Remove (with `dry_run`, only find) what dead writers left on the server; the locations
    removed, as users see them (`s3://BUCKET/PREFIX/...`)."""
    now, objects = time.time(), remote.objects()
    markers = {m["path"].removesuffix(COMMIT) for m in objects if m["path"].endswith(COMMIT)}
    removals: dict[str, list[str]] = {}
    busy = set()
    for path in (m["path"] for m in objects if _is_lock(m["path"])):
        found = object_locks.lock_owner(remote, path)
        if found is not None and lockfile.is_live(*found):
            busy.add(path.removesuffix(object_locks.SUFFIX))
        else:
            removals[path] = [path]
    for meta in objects:
        old = now - meta["last_modified"].timestamp() > grace_s
        if meta["path"].startswith(PROBE) and old:
            removals[meta["path"]] = [meta["path"]]
    for name, group in sorted(_groups(objects).items()):
        if f"{group.stage}/{group.key}" in busy or f"{name.rpartition('/')[0]}/" in removals:
            continue  # a key being computed; a checkpoint of an area removed whole
        doomed = _leftovers(remote, name, group, markers, now - group.newest > grace_s)
        if doomed:
            removals[f"{name}/"] = doomed
    if not dry_run:
        remote.delete([path for paths in removals.values() for path in paths])
    return [f"{remote.url}/{name}" for name in sorted(removals)]


def _is_lock(path: str) -> bool:
    return path.count("/") == 1 and path.endswith(object_locks.SUFFIX)


def _leftovers(
    remote: ObjectStore, name: str, group: _Group, markers: set[str], old: bool
) -> list[str]:
    """The objects of the group `name` that nothing keeps: `old` says it is past the grace."""
    artifact = f"{group.stage}/{group.key}.zarr"
    if name == artifact:
        if name not in markers:  # a writer that died before its marker
            return group.paths if old else []
        listed = {f"{name}/{path}" for path in remote.manifest(name) or {}}
        return [path for path in group.paths if path not in listed] if old else []
    if name.count("/") == 1:  # a checkpoint area: gone once its artifact is committed
        return group.paths if artifact in markers else []
    return group.paths if old and name not in markers else []  # a checkpoint without its marker
