"""A sealed Zarr group: every array written with zarr's crc32c checksum, and, once complete, the
sha256 of each array's contents, of each member's metadata and of the group's attributes recorded
in its attributes. Reading a sealed group checks its metadata and attributes; `member_problems`
recomputes every checksum; a failure to read stored data is told apart from any other and named
(`DamagedMember`: the artifact, or the checkpoint, and the member). Artifacts and checkpoints are
both sealed groups."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import traceback
from collections.abc import Awaitable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedhet.core.errors import DamagedArtifactError, FedhetError
from fedhet.process import interrupts

if TYPE_CHECKING:  # imported where an array is read or written: zarr takes 0.15 s to import
    import zarr


def create_array(group: zarr.Group, name: str, **options: Any) -> zarr.Array:
    """`group.create_array(name, **options)` with zarr's crc32c checksum after the default
    compression, so that a damaged chunk fails to read: every array of the store (artifacts and
    checkpoints) is written here. Arrays written before carry none and read as before."""
    from zarr.codecs import Crc32cCodec, ZstdCodec

    return group.create_array(name, compressors=(ZstdCodec(), Crc32cCodec()), **options)


def create_groups(group: zarr.Group, parts: Mapping[str, Mapping[str, np.ndarray]]) -> None:
    """Each subgroup `path` of `group` in `parts`, empty or with its arrays (name -> data; a
    name "a/b" makes its group "a" too), each array as `create_array` writes it: all in one
    call into zarr's event loop, the groups first, then the arrays concurrently. A call per
    group and per array waits for thread switches and a file write each, which was most of a
    small checkpoint's save time. The files are the same bytes either way."""
    from zarr.api.asynchronous import create_array as new_array
    from zarr.api.asynchronous import create_group as new_group
    from zarr.codecs import Crc32cCodec, ZstdCodec
    from zarr.core.sync import sync

    def inside(path: str) -> str:
        return f"{group.path}/{path}".lstrip("/")

    async def all_of(writes: Iterable[Awaitable[object]]) -> None:
        """Every write finished, then the first failure raised (a full disk): none is still
        writing into a folder its caller then deletes."""
        for result in await asyncio.gather(*writes, return_exceptions=True):
            if isinstance(result, BaseException):
                raise result

    async def write_all() -> None:
        await all_of(new_group(store=group.store, path=inside(path)) for path in parts)
        await all_of(
            new_array(
                group.store,
                name=inside(f"{path}/{name}"),
                data=data,
                compressors=(ZstdCodec(), Crc32cCodec()),
            )
            for path, arrays in parts.items()
            for name, data in arrays.items()
        )

    with interrupts.deferred():  # Ctrl-C here would leave the writes running on zarr's loop
        sync(write_all())


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


def stored_attributes(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "zarr.json").read_bytes()).get("attributes", {})


def seal(group: zarr.Group) -> None:
    """Record, in the attributes of the complete `group` (a root), the checksum of each member's
    metadata, then of its attributes: a later read of a member or of an attribute checks it."""
    folder = Path(group.store.root)
    attrs = stored_attributes(folder) | {METADATA_CHECKSUMS: metadata_checksums(folder)}
    group.update_attributes(  # one write of its metadata (attrs.update writes one per key)
        {
            METADATA_CHECKSUMS: attrs[METADATA_CHECKSUMS],
            ATTRIBUTES_CHECKSUM: attributes_checksum(attrs),
        }
    )


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
        attrs = stored_attributes(folder)
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


def member_problems(folder: Path, decode: bool = True) -> list[tuple[str, str]]:
    """Every damaged part of the stored group in `folder`, as (member, why), found by
    recomputing its checksums: its attributes; each member's metadata (missing, changed or
    unreadable); each array's contents (a chunk failing its crc32c, or the array its sha256).
    Without `decode`, no array is decoded: each chunk's crc32c is checked on its stored bytes
    (several times faster; a chunk deleted or rewritten whole, its crc32c with it, is then
    not found: only the sha256 of the decoded array finds that)."""
    try:
        attrs = stored_attributes(folder)
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
            why = _contents_problem(folder, member, contents, decode)
        if why is not None:
            problems.append((member, why))
    return problems


def _contents_problem(
    folder: Path, member: str, contents: dict[str, str] | None, decode: bool
) -> str | None:
    """What is wrong with `member` of the group in `folder` (an array's contents; a group has
    none), its metadata being as sealed."""
    try:
        metadata = json.loads((folder / member / "zarr.json").read_bytes())
        is_array = metadata["node_type"] == "array"
    except Exception:  # metadata that does not parse, whatever json raised on it
        return "unreadable metadata"
    if not is_array:
        return None
    if contents is not None and member not in contents:
        return "no recorded checksum"
    if not decode:
        return _chunk_problem(folder / member, metadata)
    return _decoded_problem(folder / member, None if contents is None else contents[member])


def _decoded_problem(array_folder: Path, recorded: str | None) -> str | None:
    """What is wrong with the stored array in `array_folder`, decoded: a chunk failing its
    crc32c or to decode, or the contents their `recorded` sha256."""
    import zarr

    try:
        array = zarr.open_array(array_folder, mode="r")
    except Exception:  # metadata zarr cannot read, whatever it raised
        return "unreadable metadata"
    try:
        actual = array_checksum(array)
    except Exception as err:  # a corrupt chunk fails its checksum, or to decode
        return "checksum mismatch" if damaged_array(err) else f"unreadable chunk ({err})"
    if recorded is not None and actual != recorded:
        return "checksum mismatch (stored data changed)"
    return None


def _chunk_problem(array_folder: Path, metadata: dict[str, Any]) -> str | None:
    """Whether a stored chunk of the array in `array_folder` fails the crc32c it ends with
    (zarr's Crc32cCodec, the last of its codecs; an array written before carries none): then
    "checksum mismatch". The chunks are read as stored bytes, not decoded."""
    import google_crc32c

    if [codec.get("name") for codec in metadata.get("codecs", [])][-1:] != ["crc32c"]:
        return None
    chunks = array_folder / "c"  # the chunks' keys: "c", or "c/0/1" ("/": create_array's default)
    stored = [chunks] if chunks.is_file() else sorted(p for p in chunks.rglob("*") if p.is_file())
    for chunk in stored:
        data = chunk.read_bytes()
        if google_crc32c.value(data[:-4]) != int.from_bytes(data[-4:], "little"):
            return "checksum mismatch"
    return None
