"""A stage's checkpoint area on an object store, so that another machine resumes a run.

While a machine holds a key's lock, its local checkpoint area (`<key>.partial/` in the local
copy) and the server's (`<stage>/<key>.partial/`) are kept in step: taking the lock brings the
server's entries this machine lacks; a thread then sends the machine's new entries every
heartbeat (`lockfile.stale_after() / 6`) and deletes from the server those the machine deleted;
releasing the lock does it once more, or, when the artifact is committed, deletes the server's
area. An entry is a group (a checkpoint, a delta of the clients' states), written as an
artifact is (its files, then a commit marker), or a single file (a recorded divergence). Names
starting with "." (a checkpoint being written) are never sent. A pass that finds an entry gone
while it reads it (the run's next checkpoint replaced it) stops there; the next pass goes on,
so the server always holds a whole checkpoint once one was sent."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from fedhet.core.errors import DamagedArtifactError, FedhetError
from fedhet.core.object_store import COMMIT, ObjectStore, artifact, partial_area
from fedhet.process import lockfile


class PartialMirror:
    """The checkpoint area `folder` of `stage/key` kept in step with the server's, from now
    (the server's entries are fetched first) until `stop()`."""

    def __init__(self, remote: ObjectStore, stage: str, key: str, folder: Path):
        self.remote, self.folder = remote, folder
        self.area, self.artifact = partial_area(stage, key), artifact(stage, key)
        self._sent: dict[str, str] = {}  # single files sent: name -> sha256
        self._restore()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fedhet-s3-partial")
        self._thread.start()

    def _server_entries(self) -> tuple[set[str], set[str]]:
        """The names of the committed groups and of the single files in the server's area."""
        groups, files = set(), set()
        for meta in self.remote.objects(f"{self.area}/"):
            name = meta["path"].removeprefix(f"{self.area}/")
            if name.endswith(COMMIT) and "/" not in name:
                groups.add(name.removesuffix(COMMIT))
            elif "/" not in name:
                files.add(name)
        return groups, files

    def _local_entries(self) -> dict[str, Path]:
        if not self.folder.is_dir():
            return {}
        entries = [e for e in self.folder.iterdir() if not e.name.startswith(".")]
        return {e.name: e for e in sorted(entries, key=_written)}  # a delta before its checkpoint

    def _restore(self) -> None:
        import obstore

        groups, files = self._server_entries()
        local = self._local_entries()
        for name in sorted(groups - local.keys()):
            self.folder.mkdir(parents=True, exist_ok=True)
            try:
                self.remote.get_group(f"{self.area}/{name}", self.folder / name)
            except DamagedArtifactError:  # not what its marker says: never read, resumed before
                continue
        for name in sorted(files - local.keys()):
            self.folder.mkdir(parents=True, exist_ok=True)
            with self.remote.reaching():
                data = bytes(obstore.get(self.remote.store, f"{self.area}/{name}").bytes())
            (self.folder / name).write_bytes(data)
            self._sent[name] = hashlib.sha256(data).hexdigest()

    def _run(self) -> None:
        interval = max(0.05, lockfile.stale_after() / 6)
        while not self._stop.wait(interval):
            try:
                self.send()
            except (FedhetError, OSError):  # a server away for a moment: the next pass
                pass

    def send(self) -> None:
        """Send the entries the server lacks, then delete those this machine no longer has."""
        import obstore

        groups, files = self._server_entries()
        local = self._local_entries()
        try:
            for name, entry in local.items():
                if entry.is_dir() and name not in groups:
                    self.remote.put_group(entry, f"{self.area}/{name}")
                elif entry.is_file():
                    data = entry.read_bytes()
                    digest = hashlib.sha256(data).hexdigest()
                    if name not in files or self._sent.get(name) != digest:
                        with self.remote.reaching():
                            obstore.put(self.remote.store, f"{self.area}/{name}", data)
                        self._sent[name] = digest
        except FileNotFoundError:  # the area changed under this pass: the next one goes on
            return
        for name in sorted(groups - local.keys()):
            self.remote.delete_group(f"{self.area}/{name}")
        self.remote.delete([f"{self.area}/{name}" for name in sorted(files - local.keys())])

    def stop(self) -> None:
        """Stop the thread and send once more (when the artifact is committed, delete the
        server's area instead). A server that cannot be reached leaves the server's area as it
        was: the next holder resumes from what it holds, `artifacts gc` removes it later."""
        self._stop.set()
        self._thread.join()
        try:
            if self.remote.manifest(self.artifact) is not None:
                self.remote.delete([m["path"] for m in self.remote.objects(f"{self.area}/")])
            else:
                self.send()
        except (FedhetError, OSError):
            pass


def _written(entry: Path) -> tuple[float, str]:
    try:
        return entry.stat().st_mtime, entry.name
    except FileNotFoundError:
        return 0.0, entry.name
