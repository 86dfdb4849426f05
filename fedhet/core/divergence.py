"""A divergence is a result: when a stage diverges, the rounds before it are recorded in the
stage's partial folder, so that readers (report, export, eval) report the run without computing
it again."""

from __future__ import annotations

import json
from pathlib import Path

from fedhet.core.errors import DivergedError
from fedhet.core.sealed import damaged, json_checksum

MARKER = "diverged.json"
CHECKSUM = "checksum"  # of the rest of the record: its `json_checksum`


def record(partial: Path, error: DivergedError) -> None:
    """Keep `error` (its message, round and the metrics before it) in the `partial` folder."""
    partial.mkdir(parents=True, exist_ok=True)
    content = {"message": str(error), "round": error.round_number, "metrics": error.metrics}
    (partial / MARKER).write_text(json.dumps({**content, CHECKSUM: json_checksum(content)}))


def recorded(partial: Path) -> DivergedError | None:
    """The divergence recorded in `partial`, else None."""
    marker = partial / MARKER
    if not marker.exists():
        return None
    stage, key = partial.parent.name, partial.name.removesuffix(".partial")
    try:
        content = json.loads(marker.read_text())
        checksum = content.pop(CHECKSUM, None)  # None: recorded before the checksum
        error = DivergedError(content["message"], content["round"], content["metrics"], key)
    except (ValueError, KeyError, TypeError, AttributeError):  # what a damaged record raises
        raise damaged(stage, key, MARKER, "unreadable") from None
    if checksum is not None and checksum != json_checksum(content):
        raise damaged(stage, key, MARKER, "checksum mismatch")
    return error


def forget(partial: Path) -> None:
    """Drop the divergence recorded in `partial` (if any): the stage is computed again, from its
    last checkpoint, the next time it is needed."""
    (partial / MARKER).unlink(missing_ok=True)
