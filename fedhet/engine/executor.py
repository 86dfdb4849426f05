"""Where a round's clients train: the one seam between the round loop and the clients' work.

The engine hands an executor one function (a client's local training) and the round's jobs;
the executor returns the results in the jobs' order. Algorithms never see it, so a parallel
executor (threads, processes, devices) is one more class with `map`, as FedJAX's
`for_each_client` hides its backends. Results must not depend on the executor: each job carries
its own seeded generator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from fedhet.engine.local import Divergence

Job = TypeVar("Job")
Result = TypeVar("Result")


class ClientDiverged(Exception):
    """A client's local training diverged (raised through the executor; the round fails)."""

    def __init__(self, client: int, divergence: Divergence):
        super().__init__(f"client {client}: {divergence}")


class ClientExecutor(Protocol):
    def map(self, fn: Callable[[Job], Result], jobs: Sequence[Job]) -> list[Result]:
        """`fn(job)` for every job, in the jobs' order; an exception raised by `fn` propagates
        (the first one in the jobs' order)."""
        ...


class SequentialExecutor:
    """Every client in turn, in this process."""

    def map(self, fn: Callable[[Job], Result], jobs: Sequence[Job]) -> list[Result]:
        return [fn(job) for job in jobs]
