"""The files of a sealed group (fedhet.core.sealed.seal) as zarr reads them, each member's metadata
checked as it is read: a member recorded when the group was sealed must be there, and its
metadata unchanged, else the error `damaged` makes. Every read of an artifact or a checkpoint
goes through it (fedhet.core.sealed.open_sealed), so a missing or edited `zarr.json` of any array
or group is a DamagedArtifactError naming it wherever it is read, never a member left out."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from zarr.abc.store import ByteRequest
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import LocalStore, WrapperStore

METADATA = "zarr.json"


# what to raise for a damaged member: (member path, why) -> the error
Damaged = Callable[[str, str], Exception]


class CheckedStore(WrapperStore[LocalStore]):
    def __init__(self, store: LocalStore, recorded: dict[str, str | None], damaged: Damaged):
        """`recorded`: member path -> the sha256 of its metadata, or None where only its
        presence is known (a group sealed before metadata checksums: the arrays it lists)."""
        super().__init__(store)
        self.recorded, self._damaged = recorded, damaged
        self.children: dict[str, set[str]] = {}
        for member in recorded:
            parent, _, name = member.rpartition("/")
            self.children.setdefault(parent, set()).add(name)

    def _with_store(self, store: LocalStore) -> CheckedStore:
        return type(self)(store, self.recorded, self._damaged)

    @property
    def root(self) -> Path:
        return self._store.root

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        found = await self._store.get(key, prototype, byte_range)
        member, _, name = key.rpartition("/")
        if name != METADATA or member not in self.recorded:
            return found
        if found is None:
            raise self._damaged(member, "metadata missing")
        expected = self.recorded[member]
        if expected is not None and hashlib.sha256(found.to_bytes()).hexdigest() != expected:
            raise self._damaged(member, "metadata changed: checksum mismatch")
        return found

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        """The members under `prefix`; DamagedMember when a recorded one is gone."""
        listed = [name async for name in self._store.list_dir(prefix)]
        parent = prefix.strip("/")
        missing = sorted(self.children.get(parent, set()) - set(listed))
        if missing:
            raise self._damaged(f"{parent}/{missing[0]}".lstrip("/"), "missing")
        for name in listed:
            yield name
