"""A lock that works on a shared filesystem (NFS), where flock is unreliable.

The lock is a file created atomically (`O_CREAT | O_EXCL`) holding its owner as JSON (host, pid,
start time, a unique token). While held, a heartbeat thread touches the file's modification
time. The lock goes stale when its owner is known dead (same host, process gone) or its
heartbeat is older than `stale_after()` seconds (another machine died or lost the store); a
stale lock is taken over race-free: the taker first renames the file to a name of its own,
and only the process whose rename moved the stale owner's file goes on.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

STALE_ENV = "FEDHET_LOCK_STALE_S"
DEFAULT_STALE_S = 60.0


def stale_after() -> float:
    """Seconds without a heartbeat after which a lock of another host is stale."""
    return float(os.environ.get(STALE_ENV, DEFAULT_STALE_S))


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    started: float
    token: str

    @classmethod
    def me(cls) -> Owner:
        return cls(socket.gethostname(), os.getpid(), time.time(), uuid.uuid4().hex)

    def describe(self) -> str:
        return f"{self.host}:{self.pid}"


UNKNOWN = Owner("?", 0, 0.0, "")  # a lock file without its content (being created, or its
# creator died right then): judged by its age alone


def read_owner(path: Path) -> tuple[Owner, float] | None:
    """The owner of the lock at `path` and its last heartbeat; None when there is no lock."""
    try:
        heartbeat = path.stat().st_mtime
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return Owner(**json.loads(text)), heartbeat
    except (ValueError, TypeError):
        return UNKNOWN, heartbeat


def process_alive(pid: int) -> bool:
    """Whether process `pid` of this host exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def is_live(owner: Owner, heartbeat: float) -> bool:
    if owner.host == socket.gethostname() and not process_alive(owner.pid):
        return False
    return time.time() - heartbeat < stale_after()


def holder(path: Path) -> Owner | None:
    """The live owner of the lock at `path`, or None when it is free or stale."""
    found = read_owner(path)
    return found[0] if found is not None and is_live(*found) else None


class Lease:
    """A held lock; `release()` (or leaving the `with` block) frees it."""

    def __init__(self, path: Path, owner: Owner):
        self.path, self.owner = path, owner
        self.took_over: Owner | None = None  # the dead owner whose stale lock this replaced
        self._also: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True, name="fedhet-lock")
        self._beat.start()

    def _heartbeat(self) -> None:
        interval = max(0.05, stale_after() / 6)
        while not self._stop.wait(interval):
            if self._mine():
                os.utime(self.path)

    def _mine(self) -> bool:
        found = read_owner(self.path)
        return found is not None and found[0].token == self.owner.token

    def also_release(self, release: Callable[[], None]) -> None:
        """Call `release` (of a lock held with this one, elsewhere) when this one is released."""
        self._also.append(release)

    def release(self) -> None:
        self._stop.set()
        self._beat.join()
        for release in self._also:
            release()
        if self._mine():
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _create(path: Path, owner: Owner) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(asdict(owner)))
        handle.flush()
        os.fsync(handle.fileno())
    return True


def _take_over(path: Path, stale: Owner) -> bool:
    """Remove the stale lock of `stale`; False when another process got there first."""
    moved = path.with_name(f"{path.name}.stale-{uuid.uuid4().hex[:12]}")
    try:
        os.rename(path, moved)
    except FileNotFoundError:
        return False
    found = read_owner(moved)
    if found is not None and found[0].token != stale.token:
        # another process took it over and locked it between our read and our rename: put its
        # lock back (link fails only if a third process locked meanwhile, which it then keeps)
        try:
            os.link(moved, path)
        except FileExistsError:
            pass
        moved.unlink(missing_ok=True)
        return False
    moved.unlink(missing_ok=True)
    return True


def try_acquire(path: Path) -> Lease | None:
    """The lock at `path` if it is free or stale (taking it over); None while a live owner
    holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    owner, took_over = Owner.me(), None
    for _ in range(3):  # a lost race for a stale lock is retried once or twice
        if _create(path, owner):
            lease = Lease(path, owner)
            lease.took_over = took_over
            return lease
        found = read_owner(path)
        if found is None:  # released this instant: try again
            continue
        if is_live(*found):
            return None
        if _take_over(path, found[0]):
            took_over = found[0]
    return None


def acquire(path: Path, poll_s: float = 0.2) -> Lease:
    """The lock at `path`, waiting while a live owner holds it."""
    while (lease := try_acquire(path)) is None:
        time.sleep(poll_s)
    return lease
