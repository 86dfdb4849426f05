"""Copying artifacts between two stores (`fedhet artifacts push/pull`): a folder and an object
store, or any two. Each artifact is copied file by file, bit for bit, and published in the
destination as a write would be (a temporary renamed into place; on an object store, its files
then its commit marker): keys and checksums are preserved, and a copy interrupted part-way
resumes, when run again, with the artifacts not yet in the destination."""

from __future__ import annotations

from collections.abc import Iterator

from fedhet.core.sealed import damaged
from fedhet.core.store import ArtifactInfo, ArtifactStore


def copy_artifacts(source: ArtifactStore, destination: ArtifactStore) -> Iterator[ArtifactInfo]:
    """Copy every artifact of `source` missing from `destination`, verified first (a damaged
    one stops the copy with a DamagedArtifactError naming it); yields each one copied."""
    for info in source.ls():
        if destination.exists(info.stage, info.key):
            continue
        problems = source.verify(info.stage, info.key)
        if problems:
            member, _, why = problems[0].partition(": ")
            raise damaged(info.stage, info.key, member, why)
        with destination.lock(info.stage, info.key):
            if not destination.exists(info.stage, info.key):
                destination.adopt(info.path, info.stage, info.key)
                yield info
