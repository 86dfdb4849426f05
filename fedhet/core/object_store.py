"""An artifact store on S3-compatible object storage (`s3://bucket/prefix`), through obstore.

Object stores have no rename, so an artifact is published by writing every file of its Zarr
group under `<prefix>/<stage>/<key>.zarr/` and then a commit marker `<key>.zarr.commit`, last,
holding the sha256 of each file: an artifact without its marker is absent, and a file that does
not match the marker is never read. Two writers of one key write the same bytes; the first
marker wins. Artifacts are read through a local copy (`cache`, one per store URL under fedhet's
cache folder), fetched once and then read by the same code as a folder store.

Credentials come only from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_ENDPOINT_URL, AWS_REGION, ...), never from the URL, so that what users see carries none.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

from fedhet.core.cache import cache_folder
from fedhet.core.errors import DamagedArtifactError, InputError, RunError
from fedhet.process import lockfile

SCHEME = "s3://"
COMMIT = ".commit"  # the marker's suffix after `<key>.zarr`
LOCK = ".lock"
MISSING = FileNotFoundError  # what obstore raises for an object that is not there
URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(where: str | Path) -> bool:
    """Whether a store location is a URL (`scheme://...`) rather than a folder."""
    return isinstance(where, str) and URL.match(where) is not None


def remote_for(where: str | Path) -> ObjectStore | None:
    """The object store at `where` when it is a URL, None for a folder; InputError for a URL
    fedhet cannot use."""
    if not is_url(where):
        return None
    assert isinstance(where, str)
    if not where.startswith(SCHEME):
        scheme = where.split("://")[0]
        raise InputError(f"store {scheme}://...: unsupported scheme; give a folder or s3://BUCKET")
    bucket, _, prefix = where.removeprefix(SCHEME).partition("/")
    if "@" in bucket or ":" in bucket:
        raise InputError(
            "store URL: credentials do not go in the URL; set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY in the environment and give s3://BUCKET/PREFIX"
        )
    if not bucket:
        raise InputError(f"store {where}: no bucket; give s3://BUCKET/PREFIX")
    return ObjectStore(bucket, prefix.strip("/"))


class ObjectStore:
    """The objects of a store under `s3://bucket/prefix`, and its local copy `cache`."""

    def __init__(self, bucket: str, prefix: str):
        from obstore.store import S3Store

        self.bucket, self.prefix = bucket, prefix
        self.url = f"{SCHEME}{bucket}/{prefix}".rstrip("/")
        endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
        self.store = S3Store(
            bucket,
            prefix=prefix or None,
            client_options={
                "allow_http": endpoint.startswith("http://"),
                "connect_timeout": "5s",
                "timeout": "60s",
            },
            retry_config={
                "max_retries": 2,
                "retry_timeout": timedelta(seconds=10),
                "backoff": {
                    "init_backoff": timedelta(milliseconds=100),
                    "max_backoff": timedelta(seconds=2),
                    "base": 2,
                },
            },
        )
        self.cache = cache_folder() / "object-stores" / bucket / (prefix or "_")
        self._conditional: bool | None = None

    # --- reaching the server -------------------------------------------------------------

    @contextmanager
    def reaching(self, when_input: bool = False) -> Iterator[None]:
        """Around a request: obstore's errors as one line naming the store and the cause (an
        InputError when checking before computing, else a RunError)."""
        import obstore.exceptions as oe

        try:
            yield
        except (oe.BaseError, OSError) as error:  # obstore raises some as OSError
            kind = InputError if when_input else RunError
            raise kind(f"store {self.url}: {_cause(str(error))}") from None

    def check(self) -> None:
        """InputError unless the bucket can be listed (credentials, bucket, endpoint); a
        store that can be read but not written fails at its first write."""
        import obstore

        with self.reaching(when_input=True):
            obstore.list_with_delimiter(self.store)

    # --- artifacts -----------------------------------------------------------------------

    def manifest(self, stage: str, key: str) -> dict[str, str] | None:
        """The committed artifact's files (relative path -> sha256), None when not committed."""
        import obstore

        with self.reaching():
            try:
                found = obstore.get(self.store, f"{stage}/{key}.zarr{COMMIT}").bytes()
            except MISSING:
                return None
        return json.loads(bytes(found))

    def publish(self, folder: Path, stage: str, key: str) -> None:
        """Write the files of the complete group in `folder` under the artifact's key, then its
        commit marker (kept as it is when another writer's is there first)."""
        import obstore

        files = {f.relative_to(folder).as_posix(): f for f in sorted(folder.rglob("*"))}
        files = {name: f for name, f in files.items() if f.is_file()}
        manifest = {}
        with self.reaching():
            for name, path in files.items():
                data = path.read_bytes()
                manifest[name] = hashlib.sha256(data).hexdigest()
                obstore.put(self.store, f"{stage}/{key}.zarr/{name}", data)
            marker = json.dumps(manifest, sort_keys=True).encode()
            try:
                obstore.put(self.store, f"{stage}/{key}.zarr{COMMIT}", marker, mode="create")
            except _taken():
                pass  # the first marker wins; its writer wrote the same bytes

    def fetch(self, stage: str, key: str, into: Path) -> bool:
        """Copy the committed artifact into the folder `into` (made whole, then renamed into
        place); False when it is not committed. A file that does not match the marker is a
        DamagedArtifactError."""
        import obstore

        manifest = self.manifest(stage, key)
        if manifest is None:
            return False
        tmp = into.with_name(f"{into.name}.tmp-fetch-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            with self.reaching():
                for name, digest in manifest.items():
                    try:
                        data = bytes(obstore.get(self.store, f"{stage}/{key}.zarr/{name}").bytes())
                    except MISSING:
                        data = None
                    if data is None or hashlib.sha256(data).hexdigest() != digest:
                        why = "missing" if data is None else "checksum mismatch"
                        raise DamagedArtifactError(
                            f"{stage}/{key[:12]}: the stored {name} in {self.url} is damaged "
                            f"({why}); `fedhet artifacts rm {key[:12]}` and recompute it"
                        )
                    (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                    (tmp / name).write_bytes(data)
            try:
                tmp.rename(into)
            except OSError:  # another process fetched it first
                if not (into / "zarr.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return True

    def committed(self) -> list[tuple[str, str]]:
        """(stage, key) of every committed artifact."""
        import obstore

        suffix = f".zarr{COMMIT}"
        with self.reaching():
            found = [o["path"] for batch in obstore.list(self.store) for o in batch]
        pairs = (path.split("/") for path in found if path.endswith(suffix))
        return sorted((p[0], p[1].removesuffix(suffix)) for p in pairs if len(p) == 2)

    def remove(self, stage: str, key: str) -> None:
        """The marker first (the artifact is then absent), then its files."""
        import obstore

        with self.reaching():
            obstore.delete(self.store, f"{stage}/{key}.zarr{COMMIT}")
            names = [
                o["path"]
                for batch in obstore.list(self.store, prefix=f"{stage}/{key}.zarr/")
                for o in batch
            ]
            if names:
                obstore.delete(self.store, names)

    # --- locks ---------------------------------------------------------------------------

    def conditional_writes(self) -> bool:
        """Whether the server honours If-None-Match (`mode="create"`), tried once; when not,
        said once on stderr: locks across machines are then best effort."""
        import obstore

        if self._conditional is None:
            probe = f".fedhet-probe-{uuid.uuid4().hex[:12]}"
            with self.reaching():
                obstore.put(self.store, probe, b"1", mode="create")
                try:
                    obstore.put(self.store, probe, b"2", mode="create")
                    self._conditional = False
                except _taken():
                    self._conditional = True
                obstore.delete(self.store, probe)
            if not self._conditional:
                print(
                    f"fedhet: {self.url}: the server ignores conditional writes "
                    "(If-None-Match); locks across machines are best effort",
                    file=sys.stderr,
                )
        return self._conditional

    def _lock_owner(self, path: str) -> tuple[lockfile.Owner, float] | None:
        import obstore

        try:
            found = obstore.get(self.store, path)
        except MISSING:
            return None
        heartbeat = found.meta["last_modified"].timestamp()
        try:
            return lockfile.Owner(**json.loads(bytes(found.bytes()))), heartbeat
        except (ValueError, TypeError):
            return lockfile.UNKNOWN, heartbeat

    def holder(self, stage: str, key: str) -> lockfile.Owner | None:
        """The live owner of the key's lock, judged as a lock file's (`lockfile.is_live`): a
        process of this host that is gone, or a heartbeat older than `stale_after()`, is not."""
        with self.reaching():
            found = self._lock_owner(f"{stage}/{key}{LOCK}")
        return found[0] if found is not None and lockfile.is_live(*found) else None

    def try_lock(self, stage: str, key: str) -> RemoteLease | None:
        """The key's lock, written with If-None-Match; None while a live owner holds it (a
        dead owner's is deleted and taken)."""
        import obstore

        path, owner = f"{stage}/{key}{LOCK}", lockfile.Owner.me()
        conditional = self.conditional_writes()
        with self.reaching():
            for _ in range(2):
                found = self._lock_owner(path)
                if found is not None:
                    if lockfile.is_live(*found):
                        return None
                    obstore.delete(self.store, path)
                try:
                    obstore.put(self.store, path, _owner_bytes(owner), mode="create")
                except _taken():
                    continue
                mine = conditional or (self._lock_owner(path) or (None,))[0] == owner
                return RemoteLease(self, path, owner) if mine else None
        return None


class RemoteLease:
    """A held lock object; a heartbeat thread rewrites it, `release()` deletes it."""

    def __init__(self, remote: ObjectStore, path: str, owner: lockfile.Owner):
        self.remote, self.path, self.owner = remote, path, owner
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
            found = self.remote._lock_owner(self.path)
            if found is not None and found[0] == self.owner:
                obstore.delete(self.remote.store, self.path)
        except Exception:  # unreachable: the lock goes stale after `stale_after()`
            pass


def _taken() -> tuple[type[Exception], ...]:
    """What obstore raises when a conditional write finds the object there."""
    import obstore.exceptions as oe

    return (FileExistsError, oe.AlreadyExistsError, oe.PreconditionError)


def _owner_bytes(owner: lockfile.Owner) -> bytes:
    return json.dumps(asdict(owner)).encode()


def _cause(message: str) -> str:
    """What a server's answer or a failed request says, in a few words and how to fix it."""
    known = [
        ("169.254.169.254", "no credentials; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
        ("NoSuchBucket", "no such bucket; create it or fix the bucket name"),
        ("InvalidAccessKeyId", "the access key is unknown; check AWS_ACCESS_KEY_ID"),
        ("SignatureDoesNotMatch", "wrong credentials; check AWS_SECRET_ACCESS_KEY"),
        ("AccessDenied", "access denied; check the credentials' rights on the bucket"),
        ("error sending request", "unreachable; check AWS_ENDPOINT_URL and the network"),
        ("403 Forbidden", "access denied; check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
    ]
    for marker, said in known:
        if marker in message:
            return said
    return " ".join(message.split())[:200]
