"""The two kinds of failure the CLI reports, each with its exit code, and the failures that the
Python API's callers may want to tell apart (a damaged artifact, a diverged run)."""

import traceback


class FedhetError(Exception):
    """Base class: a failure with a one-line message meant for the user."""

    exit_code = 1


class InputError(FedhetError):
    """Invalid input: a bad spec, an unknown dataset, missing data files, bad arguments."""

    exit_code = 2


class RunError(FedhetError):
    """A failure while running (e.g. divergence); partial artifacts are kept."""

    exit_code = 1


class DamagedArtifactError(RunError):
    """A stored artifact that no longer reads as written: a chunk fails its checksum, or its
    metadata does not parse. The message names the artifact (`stage/key`) and what is damaged."""


class DivergedError(RunError):
    """A run's loss or model became non-finite; `metrics` are the rounds completed before;
    `key` the key of the stage that diverged, once it is known (recorded)."""

    def __init__(
        self,
        message: str,
        round_number: int,
        metrics: dict[str, list[float]],
        key: str | None = None,
    ):
        super().__init__(message)
        self.round_number = round_number
        self.metrics = metrics
        self.key = key

    def __reduce__(self):  # travels back from a worker process or a Ray task whole
        return type(self), (str(self), self.round_number, self.metrics, self.key)


def release_frames(error: BaseException) -> None:
    """Clear the locals of the finished frames in the tracebacks of `error` and of the errors it
    chains (cause, context): an error kept after its stage (a sweep's failures, a pool worker's
    last exception) then no longer holds the stage's tensors."""
    pending, seen = [error], set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        pending += [current.__cause__, current.__context__]
