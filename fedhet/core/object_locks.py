"""Per-key locks on an object store: an object `<stage>/<key>.lock` holding its owner, written
with If-None-Match where the server honours it (`ObjectStore.conditional_writes`; else read back,
best effort) and rewritten as a heartbeat. It is judged as a lock file is (`lockfile.is_live`): a
process of this host that is gone, or a heartbeat older than `stale_after()`, has left it stale,
and a stale lock is deleted and taken."""

from __future__ import annotations

import json
import threading
from dataclasses import asdict

from fedhet.core.object_store import ObjectStore, taken
from fedhet.process import lockfile

SUFFIX = ".lock"


def lock_name(stage: str, key: str) -> str:
    return f"{stage}/{key}{SUFFIX}"


def lock_owner(remote: ObjectStore, path: str) -> tuple[lockfile.Owner, float] | None:
    """The owner of the lock object at `path` and its last heartbeat; None when there is none."""
    import obstore

    try:
        found = obstore.get(remote.store, path)
    except FileNotFoundError:
        return None
    heartbeat = found.meta["last_modified"].timestamp()
    try:
        return lockfile.Owner(**json.loads(bytes(found.bytes()))), heartbeat
    except (ValueError, TypeError):
        return lockfile.UNKNOWN, heartbeat


def holder(remote: ObjectStore, stage: str, key: str) -> lockfile.Owner | None:
    """The live owner of the key's lock, if any."""
    with remote.reaching():
        found = lock_owner(remote, lock_name(stage, key))
    return found[0] if found is not None and lockfile.is_live(*found) else None


def try_lock(remote: ObjectStore, stage: str, key: str) -> RemoteLease | None:
    """The key's lock; None while a live owner holds it (a dead owner's is deleted and taken)."""
    import obstore

    path, owner = lock_name(stage, key), lockfile.Owner.me()
    conditional, dead = remote.conditional_writes(), None
    with remote.reaching():
        for _ in range(2):
            found = lock_owner(remote, path)
            if found is not None:
                if lockfile.is_live(*found):
                    return None
                obstore.delete(remote.store, path)
                dead = found[0]
            try:
                obstore.put(remote.store, path, _owner_bytes(owner), mode="create")
            except taken():
                continue
            if not conditional and (lock_owner(remote, path) or (None,))[0] != owner:
                return None
            lease = RemoteLease(remote, path, owner)
            lease.took_over = dead
            return lease
    return None


class RemoteLease:
    """A held lock object; a heartbeat thread rewrites it, `release()` deletes it."""

    def __init__(self, remote: ObjectStore, path: str, owner: lockfile.Owner):
        self.remote, self.path, self.owner = remote, path, owner
        self.took_over: lockfile.Owner | None = None  # the dead owner whose stale lock it replaced
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True, name="fedhet-s3-lock")
        self._beat.start()

    def _heartbeat(self) -> None:
        import obstore

        interval = max(0.05, lockfile.stale_after() / 6)
        while not self._stop.wait(interval):
            try:
                obstore.put(self.remote.store, self.path, _owner_bytes(self.owner))
            except Exception:  # a server away for a moment: the next beat tries again
                pass

    def release(self) -> None:
        import obstore

        self._stop.set()
        self._beat.join()
        try:
            found = lock_owner(self.remote, self.path)
            if found is not None and found[0] == self.owner:
                obstore.delete(self.remote.store, self.path)
        except Exception:  # unreachable: the lock goes stale after `stale_after()`
            pass


def _owner_bytes(owner: lockfile.Owner) -> bytes:
    return json.dumps(asdict(owner)).encode()
