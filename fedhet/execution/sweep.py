"""A spec's runs as one sweep: every stage node of every run scheduled over the stage DAG,
computed by local worker processes (`--jobs N`) or Ray tasks (`--ray`, `--ray-address`)."""

from __future__ import annotations

from rich.console import Console

from fedhet.core.errors import InputError, release_frames
from fedhet.core.pipeline import ProgressSink, RunContext, compute
from fedhet.core.store import ArtifactStore
from fedhet.execution.local_processes import LocalProcesses, progress_sink
from fedhet.execution.planning import Run
from fedhet.execution.scheduler import Executor, Listener, NodeState, Scheduler
from fedhet.execution.tasks import Task, plan_tasks


def compute_task(task: Task) -> str:
    """Compute one node in a worker (its upstream is stored): what `pipeline.compute` did.
    Its messages stay in the worker; the sweep's view tells what happens."""
    quiet = Console(stderr=True, quiet=True)
    store = ArtifactStore(task.store_root)
    ctx = RunContext(task.spec, store, quiet, task.run_name, task.labels, progress_sink())
    try:
        return compute(task.node, ctx, wait=False)  # task.spec is the node's own already
    except BaseException as error:  # a pool's worker keeps the last exception it sent back
        release_frames(error)
        raise


def executor_for(
    runs: list[Run],
    jobs: int | None,
    ray_address: str | None,
    threads: int,
    on_progress: ProgressSink | None = None,
) -> Executor:
    """Local worker processes (`jobs`) or Ray tasks (`ray_address`: "local" starts a Ray here);
    the local workers report the progress of their nodes to `on_progress`."""
    if ray_address is None:
        return LocalProcesses(compute_task, jobs or 1, threads, on_progress)
    from fedhet.execution.ray_tasks import RayTasks

    asks = {(r.spec.runtime.resources.cpus, r.spec.runtime.resources.gpus) for r in runs}
    if len(asks) > 1:
        raise InputError("runtime.resources: give every run of a sweep the same resources")
    cpus, gpus = asks.pop()
    return RayTasks(compute_task, ray_address, cpus, gpus)


def check_writable(store: ArtifactStore, named: str = "--store") -> None:
    """InputError unless the store can be written (before any worker starts; an object
    store was checked when opened)."""
    if store.remote is not None:
        return
    probe = store.root / f".write-probe-{id(store)}"
    created = not store.root.exists()
    try:
        store.root.mkdir(parents=True, exist_ok=True)
        probe.touch()
        probe.unlink()
        if created:  # nothing is left behind by a command that fails on other input
            store.root.rmdir()
    except OSError as error:
        raise InputError(
            f"{named} {store.root}: not writable ({error.strerror}); give a writable folder"
        ) from None


def sweep(
    runs: list[Run], store: ArtifactStore, executor: Executor, on_change: Listener
) -> dict[str, NodeState]:
    """Run every missing node of every run; the final state of every node by key."""
    tasks = plan_tasks(runs, store.address())
    return Scheduler(tasks, executor, on_change).run()
