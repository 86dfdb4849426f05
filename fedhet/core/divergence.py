"""A divergence is a result: when a stage diverges, the rounds before it are recorded in the
stage's partial folder, so that readers (report, export, eval) report the run without computing
it again."""

from __future__ import annotations

import json
from pathlib import Path

from fedhet.core.errors import DivergedError

MARKER = "diverged.json"


def record(partial: Path, error: DivergedError) -> None:
    """Keep `error` (its message, round and the metrics before it) in the `partial` folder."""
    partial.mkdir(parents=True, exist_ok=True)
    content = {"message": str(error), "round": error.round_number, "metrics": error.metrics}
    (partial / MARKER).write_text(json.dumps(content))


def recorded(partial: Path) -> DivergedError | None:
    """The divergence recorded in `partial`, else None."""
    marker = partial / MARKER
    if not marker.exists():
        return None
    content = json.loads(marker.read_text())
    return DivergedError(content["message"], content["round"], content["metrics"])


def forget(partial: Path) -> None:
    """Drop the divergence recorded in `partial` (if any): the stage is computed again, from its
    last checkpoint, the next time it is needed."""
    (partial / MARKER).unlink(missing_ok=True)
