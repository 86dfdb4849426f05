"""The two kinds of failure the CLI reports, each with its exit code."""

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


class DivergedError(RunError):
    """A run's loss or model became non-finite; `metrics` are the rounds completed before."""

    def __init__(self, message: str, round_number: int, metrics: dict[str, list[float]]):
        super().__init__(message)
        self.round_number = round_number
        self.metrics = metrics

    def __reduce__(self):  # travels back from a worker process or a Ray task whole
        return type(self), (str(self), self.round_number, self.metrics)


class Interrupted(BaseException):  # noqa: N818 (not an error: the user asked to stop)
    """SIGINT or SIGTERM arrived. A BaseException, so no `except Exception` swallows it; the
    stage that is running saves its checkpoint and adds where it stopped to `where`."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.exit_code = 128 + signum
        self.where = ""  # e.g. "at round 3 of 20 (train 1a2b3c4d5e6f)"
        self.stage = ""  # the stage and short key it stopped in, set once by the innermost

    def in_stage(self, stage: str) -> None:
        """Record the stage (and key) that was running, unless an inner stage already did."""
        if not self.stage:
            self.stage = stage
            self.where = f"{self.where} ({stage})" if self.where else f"in {stage}"

    def __str__(self) -> str:
        where = f" {self.where}" if self.where else ""
        return f"interrupted{where}; run the same command to resume"


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
