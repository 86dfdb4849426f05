"""An artifact store on S3-compatible object storage (`s3://bucket/prefix`), through obstore.

Object stores have no rename, so an artifact is published by writing every file of its Zarr
group under `<prefix>/<stage>/<key>.zarr/` and then a commit marker `<key>.zarr.commit`, last,
holding the sha256 of each file: an artifact without its marker is absent, and a file that does
not match the marker is never read. Two writers of one key write the same bytes; the first
marker wins. Artifacts are read through a local copy (`cache`, one per store URL under fedhet's
cache folder), fetched once and then read by the same code as a folder store. A stage's
checkpoints are groups too, under `<stage>/<key>.partial/` (fedhet.core.object_partial); locks
are objects (fedhet.core.object_locks).

Credentials come only from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_ENDPOINT_URL, AWS_REGION, ...) and the user's AWS profile (fedhet.core.aws_profile), never
from the URL, so that what users see carries none.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from fedhet.core import aws_profile
from fedhet.core.cache import cache_folder
from fedhet.core.errors import DamagedArtifactError, InputError, RunError

if TYPE_CHECKING:
    from obstore import ObjectMeta

SCHEME = "s3://"
COMMIT = ".commit"  # the marker's suffix after `<key>.zarr`
PROBE = ".fedhet-probe-"  # an object written to find out whether writes can be conditional
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
        profile = aws_profile.settings()  # what the environment leaves unset
        endpoint = profile.get("endpoint") or next(
            (os.environ[name] for name in aws_profile.ENDPOINT_VARIABLES if os.environ.get(name)),
            "",
        )
        self.store = S3Store(
            bucket,
            prefix=prefix or None,
            config=profile or None,
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

    # --- conditional writes ------------------------------------------------------------

    def conditional_writes(self) -> bool:
        """Whether the server honours If-None-Match (`mode="create"`), tried once; when not,
        said once on stderr: locks across machines are then best effort."""
        import obstore

        if self._conditional is None:
            probe = f"{PROBE}{uuid.uuid4().hex[:12]}"
            with self.reaching():
                obstore.put(self.store, probe, b"1", mode="create")
                try:
                    obstore.put(self.store, probe, b"2", mode="create")
                    self._conditional = False
                except taken():
                    self._conditional = True
                obstore.delete(self.store, probe)
            if not self._conditional:
                print(
                    f"fedhet: {self.url}: the server ignores conditional writes "
                    "(If-None-Match); locks across machines are best effort",
                    file=sys.stderr,
                )
        return self._conditional

    # --- groups: the files of a folder under NAME/, then the commit marker NAME.commit -------

    def objects(self, prefix: str = "") -> list[ObjectMeta]:
        """Every object whose path starts with `prefix`."""
        import obstore

        with self.reaching():
            batches = obstore.list(self.store, prefix=prefix or None)
            return [meta for batch in batches for meta in batch]

    def manifest(self, name: str) -> dict[str, str] | None:
        """The committed group's files (relative path -> sha256), None when not committed."""
        import obstore

        with self.reaching():
            try:
                found = obstore.get(self.store, f"{name}{COMMIT}").bytes()
            except MISSING:
                return None
        return json.loads(bytes(found))

    def put_group(self, folder: Path, name: str) -> None:
        """Write the files of the complete group in `folder` under `name`, then its commit
        marker (kept as it is when another writer's is there first). FileNotFoundError, and no
        marker, when the folder is gone or changes while it is read."""
        import obstore

        files, manifest = _files(folder), {}
        for path, file in files.items():
            data = file.read_bytes()
            manifest[path] = hashlib.sha256(data).hexdigest()
            with self.reaching():
                obstore.put(self.store, f"{name}/{path}", data)
        if _files(folder) != files:
            raise FileNotFoundError(folder)
        marker = json.dumps(manifest, sort_keys=True).encode()
        with self.reaching():
            try:
                obstore.put(self.store, f"{name}{COMMIT}", marker, mode="create")
            except taken():
                pass  # the first marker wins; its writer wrote the same bytes

    def get_group(self, name: str, into: Path) -> bool:
        """Copy the committed group `name` into the folder `into` (made whole, then renamed into
        place); False when it is not committed. A file that does not match the marker is a
        DamagedArtifactError."""
        import obstore

        manifest = self.manifest(name)
        if manifest is None:
            return False
        tmp = into.with_name(f"{into.name}.tmp-fetch-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            with self.reaching():
                for path, digest in manifest.items():
                    try:
                        data = bytes(obstore.get(self.store, f"{name}/{path}").bytes())
                    except MISSING:
                        data = None
                    if data is None or hashlib.sha256(data).hexdigest() != digest:
                        why = "missing" if data is None else "checksum mismatch"
                        raise self._damaged(name, path, why)
                    (tmp / path).parent.mkdir(parents=True, exist_ok=True)
                    (tmp / path).write_bytes(data)
            try:
                tmp.rename(into)
            except OSError:  # another process fetched it first
                if not (into / "zarr.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return True

    def _damaged(self, name: str, path: str, why: str) -> DamagedArtifactError:
        stage, _, entry = name.partition("/")
        key = entry.split(".")[0]
        return DamagedArtifactError(
            f"{stage}/{key[:12]}: the stored {path} in {self.url} is damaged ({why}); "
            f"`fedhet artifacts rm {key[:12]}` and recompute it"
        )

    def delete(self, paths: list[str]) -> None:
        import obstore

        if paths:
            with self.reaching():
                obstore.delete(self.store, paths)

    def delete_group(self, name: str) -> None:
        """The marker first (the group is then absent), then its files."""
        self.delete([f"{name}{COMMIT}"])
        self.delete([meta["path"] for meta in self.objects(f"{name}/")])

    # --- artifacts -----------------------------------------------------------------------

    def publish(self, folder: Path, stage: str, key: str) -> None:
        self.put_group(folder, artifact(stage, key))

    def fetch(self, stage: str, key: str, into: Path) -> bool:
        return self.get_group(artifact(stage, key), into)

    def committed(self) -> list[tuple[str, str]]:
        """(stage, key) of every committed artifact."""
        suffix = f".zarr{COMMIT}"
        found = (meta["path"].split("/") for meta in self.objects())
        pairs = (p for p in found if len(p) == 2 and p[1].endswith(suffix))
        return sorted((stage, name.removesuffix(suffix)) for stage, name in pairs)

    def remove(self, stage: str, key: str) -> None:
        """The artifact (its marker first) and its checkpoint area."""
        self.delete_group(artifact(stage, key))
        self.delete([meta["path"] for meta in self.objects(f"{partial_area(stage, key)}/")])


def _files(folder: Path) -> dict[str, Path]:
    """The files of the group in `folder`, by relative path; FileNotFoundError when none."""
    found = {f.relative_to(folder).as_posix(): f for f in sorted(folder.rglob("*")) if f.is_file()}
    if not found:
        raise FileNotFoundError(folder)
    return found


def artifact(stage: str, key: str) -> str:
    """The name of an artifact's group in the store."""
    return f"{stage}/{key}.zarr"


def partial_area(stage: str, key: str) -> str:
    """The name of the folder of a stage's checkpoints (and recorded divergence) in the store."""
    return f"{stage}/{key}.partial"


def taken() -> tuple[type[Exception], ...]:
    """What obstore raises when a conditional write finds the object there."""
    import obstore.exceptions as oe

    return (FileExistsError, oe.AlreadyExistsError, oe.PreconditionError)


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
