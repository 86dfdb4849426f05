"""Nodes as Ray tasks, on an existing cluster (`ray start --head`, `ray start --address=...`)
or on a local Ray started here. Ray is an optional extra (`pip install 'fedhet[ray]'`),
imported only when this executor is used. A task whose worker or machine died is retried by
Ray and resumes from the node's checkpoint; a node's own failure comes back as its result."""

from __future__ import annotations

import logging
import socket
from concurrent.futures import Future
from typing import Any

from fedhet.core.errors import InputError
from fedhet.execution.local_processes import Work
from fedhet.execution.tasks import Task

CONNECT_TIMEOUT_S = 5.0


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise InputError("--ray needs Ray: pip install 'fedhet[ray]' (or `make install`)") from None
    return ray


def check_reachable(address: str) -> None:
    """InputError unless something listens at `address` (host:port of a Ray head's GCS)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"--ray-address {address}: give the head's HOST:PORT, e.g. 10.0.0.1:6379")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as error:
        raise InputError(
            f"--ray-address {address}: no Ray head reachable there ({error.strerror or error}); "
            "start one with `ray start --head` or fix the address"
        ) from None


def _outcome_or_error(work: Work, task: Task) -> tuple[str | None, BaseException | None]:
    """The task body: a node's own failure is returned, so that Ray retries only dead workers."""
    try:
        return work(task), None
    except Exception as error:
        return None, error


class RayTasks:
    def __init__(self, work: Work, address: str, cpus: float, gpus: float):
        """`address`: a cluster's, "auto" (RAY_ADDRESS or the cluster `ray start` began here), or
        "local": a new Ray started here, never a cluster some earlier process left behind."""
        ray = self.ray = _import_ray()
        if address not in ("auto", "local"):
            check_reachable(address)
        self._connected_here = not ray.is_initialized()
        if self._connected_here:
            ray.init(
                address=address,
                include_dashboard=address == "local",
                log_to_driver=False,
                logging_level=logging.WARNING,  # no "connecting..." lines: stderr is the user's
            )
        try:
            self._check_fits(cpus, gpus)
        except InputError:
            self.close(cancel=True)
            raise
        self.capacity = max(1, int(ray.cluster_resources().get("CPU", 1) // max(cpus, 1e-3)))
        self.work = work
        self._remote = ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=3)(_outcome_or_error)

    def _check_fits(self, cpus: float, gpus: float) -> None:
        nodes = [n["Resources"] for n in self.ray.nodes() if n.get("Alive")]
        if not any(r.get("CPU", 0) >= cpus and r.get("GPU", 0) >= gpus for r in nodes):
            raise InputError(
                f"runtime.resources: no node of the Ray cluster has {cpus} CPUs and {gpus} GPUs "
                "free for one task; lower them or add such a node"
            )

    def submit(self, task: Task) -> Future[str]:
        result: Future[str] = Future()

        def unpack(done: Future) -> None:
            try:
                outcome, error = done.result()
            except BaseException as lost:  # Ray gave up on the task (its retries spent)
                result.set_exception(lost)
                return
            if error is not None:
                result.set_exception(error)
            else:
                result.set_result(outcome)

        self._remote.remote(self.work, task).future().add_done_callback(unpack)
        return result

    def lost(self, error: BaseException) -> bool:
        return False  # Ray retries dead workers itself

    def close(self, cancel: bool) -> None:
        """Disconnect (a local Ray started here ends with it); a cluster stays as it is."""
        if self._connected_here:
            self.ray.shutdown()
            self._connected_here = False
