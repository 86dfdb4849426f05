"""The work behind `fedhet artifacts` and `fedhet.artifacts(...)`, done once: an artifact store
listed, shown, verified, pruned, copied to or from another and collected, as rows and plain
data. The command line (fedhet.cli.artifacts) prints them, the Python API (fedhet.api) returns
them as DataFrames; both open the store's session through `open_store`, so both refuse the same
inputs with the same one-line messages, an argument named in the caller's `Wording`.

Light to import: zarr waits for an artifact's arrays, provenance for `show`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from fedhet.core.errors import InputError
from fedhet.core.sealed import ATTRIBUTES_CHECKSUM, INTEGRITY, arrays
from fedhet.core.store import GRACE_S, ArtifactInfo, ArtifactStore
from fedhet.execution.caller import Wording

if TYPE_CHECKING:
    from fedhet.spec_session import SpecSession

Row = dict[str, Any]
S = TypeVar("S", bound="StoreSession")


@dataclass(frozen=True)
class ArtifactView:
    """One artifact as `fedhet artifacts show` prints it: its attributes (less the checksums
    and the environment), the environment it was computed in (described, empty when none was
    recorded) and its arrays (`name`, `shape`, `chunks`, `dtype`)."""

    stage: str
    key: str
    path: Path
    attributes: dict[str, Any]
    environment: dict[str, str]
    arrays: list[Row]


@dataclass
class StoreSession:
    """An artifact store; `wording` names an argument in the caller's words."""

    store: ArtifactStore
    wording: Wording

    def ls_rows(
        self,
        stage: str | None = None,
        algorithm: str | None = None,
        spec: SpecSession | None = None,
    ) -> list[Row]:
        """A row per stored artifact: `stage`, `key`, `label` (of its run, or of its spec),
        `algorithm`, `size` (bytes), `created` (to the minute); only `stage`'s, `algorithm`'s
        (its name) or the stages of `spec`'s runs, where given."""
        found = self.store.ls()
        if spec is not None:
            keys = {row["key"] for row in spec.key_rows()}
            found = [a for a in found if a.key in keys]
        rows = [_listed(a) for a in found if stage in (None, a.stage)]
        return [r for r in rows if algorithm in (None, r["algorithm"])]

    def view(self, key: str) -> ArtifactView:
        """The artifact whose key (or `stage/key`) starts with `key`."""
        from fedhet.core.provenance import described

        info = self.store.find(key)
        group = self.store.open(info.stage, info.key)
        attributes = {k: v for k, v in info.attrs.items() if k not in (*INTEGRITY, "environment")}
        environment = info.attrs.get("environment")
        return ArtifactView(
            info.stage,
            info.key,
            info.path,
            attributes,
            described(environment) if environment else {},
            [
                {"name": name, "shape": a.shape, "chunks": a.chunks, "dtype": str(a.dtype)}
                for name, a in arrays(group)
            ],
        )

    def verified(self, key: str | None = None) -> Iterator[Row]:
        """Every artifact (or the one whose key starts with `key`) with its checksums (arrays,
        their metadata, attributes) recomputed, as it is checked: `stage`, `key`, `problems`
        (none when intact) and `status` ("ok", or "CORRUPT: " and the problems)."""
        for info in [self.store.find(key)] if key else self.store.ls():
            problems = self.store.verify(info.stage, info.key)
            status = "ok" if not problems else "CORRUPT: " + "; ".join(problems)
            if not problems and ATTRIBUTES_CHECKSUM not in info.attrs:
                status += " (no attribute checksum: an older artifact)"
            yield {"stage": info.stage, "key": info.key, "problems": problems, "status": status}

    def removed(self, keys: Sequence[str], cascade: bool = False) -> Iterator[Row]:
        """Remove the artifacts whose keys start with `keys`, and with `cascade` those built on
        them (InputError naming them without it), yielding each as it is removed: `stage`,
        `key`, `label`."""
        targets = {info.key: info for info in map(self.store.find, keys)}
        dependents = self.store.dependents(set(targets))
        if dependents and not cascade:
            names = ", ".join(f"{a.stage}/{a.key[:10]}" for a in dependents[:3])
            more = f" and {len(dependents) - 3} more" if len(dependents) > 3 else ""
            raise InputError(
                f"artifacts rm: {names}{more} depend{'s' if len(dependents) == 1 else ''} on it; "
                f"remove those too with {self.wording.flag('cascade')}, or leave it"
            )
        for info in [*dependents, *targets.values()]:
            self.store.remove(info)
            yield _named(info)

    def copied_to(self, destination: StoreSession) -> Iterator[Row]:
        """Copy every artifact missing from `destination`'s store into it, bit for bit (a copy
        interrupted part-way resumes when run again), yielding each as it is copied: `stage`,
        `key`, `label`."""
        from fedhet.core.transfer import copy_artifacts

        for info in copy_artifacts(self.store, destination.store):
            yield _named(info)

    def collected(self, dry_run: bool = False, grace: float = GRACE_S) -> list[str]:
        """Remove temporaries of dead writers, finished checkpoints and stale locks (on an
        object store, on the server too: files without a commit marker older than `grace`
        seconds, unreferenced objects); with `dry_run`, only list them. Their locations."""
        if grace < 0:
            raise InputError(f"{self.wording.setting('grace', grace)}: give 0 seconds or more")
        return self.store.gc(dry_run=dry_run, grace_s=grace)


def open_store(store: str | Path | None, wording: Wording, kind: type[S] = StoreSession) -> S:
    """The session (a `kind` of StoreSession) of the store `store`, a folder or a URL (default:
    FEDHET_STORE or ./artifacts); InputError for an object store that cannot be reached."""
    return kind(ArtifactStore(store), wording)


def _named(info: ArtifactInfo) -> Row:
    return {"stage": info.stage, "key": info.key, "label": info.attrs.get("label", "")}


def _listed(info: ArtifactInfo) -> Row:
    return {
        "stage": info.stage,
        "key": info.key,
        "label": info.attrs.get("label") or info.attrs.get("spec_name", ""),
        "algorithm": info.attrs.get("spec", {}).get("algorithm", {}).get("name"),
        "size": info.size,
        "created": info.attrs.get("created", "")[:16].replace("T", " "),
    }
