"""Stage planning and execution.

A spec is planned into a DAG of `StageNode`s (name, version, config, upstream nodes); each
node's key is a content hash of those. `ensure` runs the missing nodes, upstream first, and
reuses every artifact already in the store.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rich.console import Console

from fedhet.core import divergence, provenance, registry
from fedhet.core.errors import DivergedError, RunError, release_frames
from fedhet.core.keys import stage_key
from fedhet.core.plugin_isolation import PluginError
from fedhet.core.sealed import damage_named
from fedhet.core.spec import Spec
from fedhet.core.store import ArtifactStore
from fedhet.process import allocator
from fedhet.process.interrupts import Interrupted

if TYPE_CHECKING:
    import zarr


@dataclass
class StageNode:
    stage: str
    version: int
    config: dict[str, Any]
    upstream: dict[str, StageNode] = field(default_factory=dict)
    # The spec this node and its upstream run under when it is not the run's own (TCT's
    # bootstrap is the train node of an equivalent FedAvg spec). Never part of the key.
    spec: Spec | None = field(default=None, repr=False, compare=False)

    @property
    def key(self) -> str:
        return stage_key(
            self.stage, self.version, self.config, {r: n.key for r, n in self.upstream.items()}
        )

    def walk(self) -> list[StageNode]:
        """This node and all its upstream nodes, upstream first, each once."""
        seen: dict[str, StageNode] = {}
        for up in self.upstream.values():
            for node in up.walk():
                seen.setdefault(node.key, node)
        seen.setdefault(self.key, self)
        return list(seen.values())


# (node key, steps done, steps in all, the latest accuracy): e.g. round 3 of 20 of a train node
ProgressSink = Callable[[str, int, int, float], None]


@dataclass
class RunContext:
    """What every stage gets besides its node: the spec, the store, and how to talk to the user."""

    spec: Spec
    store: ArtifactStore
    console: Console = field(default_factory=lambda: Console(stderr=True))
    # Names the run whose final node is ensured (its TensorBoard folder). Upstream nodes, which
    # runs may share, are no run's own history and get None.
    run_name: str | None = None
    # key -> the name a person knows the node by (a run's label); recorded in the artifact and
    # shown in progress lines, never part of a key
    labels: dict[str, str] = field(default_factory=dict)
    # Where a long stage reports each step of a node as it goes (a sweep's live view); None
    # when no one listens
    progress: ProgressSink | None = None

    def report(self, node: StageNode, done: int, total: int, accuracy: float) -> None:
        if self.progress is not None:
            self.progress(node.key, done, total, accuracy)

    def upstream(self, node: StageNode, role: str) -> zarr.Group:
        up = node.upstream[role]
        return self.store.open(up.stage, up.key)


class StageRunner(Protocol):
    def __call__(
        self, node: StageNode, ctx: RunContext, out: zarr.Group, partial: Path
    ) -> None: ...


# What a stage's partial area says about a run in progress, e.g. "from round 4 of 20"; None
# when there is nothing to resume from.
ProgressProbe = Callable[[StageNode, Path], str | None]

STAGES: dict[str, StageRunner] = {}
PROGRESS: dict[str, ProgressProbe] = {}


def stage(name: str, progress: ProgressProbe | None = None) -> Callable[[StageRunner], StageRunner]:
    """Register the function that computes a stage's artifact, and for a stage that resumes from
    checkpoints the probe that tells from where. Such a stage `announce`s itself, once it has read
    its checkpoint: a damaged one is skipped for an earlier one."""

    def register(fn: StageRunner) -> StageRunner:
        STAGES[name] = fn
        if progress is not None:
            PROGRESS[name] = progress
        return fn

    return register


def announce(node: StageNode, ctx: RunContext, resumed: str | None = None) -> None:
    """Say in one line that `node` is computed now, or `resumed` from where (the probe's words,
    "from round 4 of 20"), with its run's label."""
    name = f"{node.stage} {node.key[:12]}"
    line = f"{name}: computing" if resumed is None else f"resuming {name} {resumed}"
    label = f" ({ctx.labels[node.key]})" if ctx.labels.get(node.key) else ""
    ctx.console.print(line + label, markup=False, soft_wrap=True)


# fedhet's own stages, imported (and so registered) on first use, as a plug-in's are: planning
# a run imports none of them (nor torch).
BUILTIN_STAGES = (
    "fedhet.data.partition_stage",
    "fedhet.data.client_test",
    "fedhet.engine.train_stage",
)


@cache
def load_stages() -> None:
    """Import every stage module, fedhet's and the plug-ins', so that their stages register."""
    for module in BUILTIN_STAGES:
        import_module(module)
    registry.load_stages()


def runner(name: str) -> StageRunner:
    """The function that computes stage `name`."""
    load_stages()
    if name not in STAGES and registry.stage_problems():  # a method's stages failed to import
        raise PluginError(f"no stage {name!r}: {'; '.join(registry.stage_problems())}")
    return STAGES[name]


def ensure(node: StageNode, ctx: RunContext) -> zarr.Group:
    """The node's artifact, computing it (and its missing upstream) if it is not in the store."""
    ctx = node_context(node, ctx)
    for up in node.upstream.values():
        ensure(up, replace(ctx, run_name=None))
    compute(node, ctx, wait=True)
    return ctx.store.open(node.stage, node.key)


def node_context(node: StageNode, ctx: RunContext) -> RunContext:
    """The context `node` and its upstream run under: its own spec where it has one."""
    return ctx if node.spec is None else replace(ctx, spec=node.spec)


# What `compute` did with a node.
COMPUTED, REUSED, BUSY = "computed", "reused", "busy"


def compute(node: StageNode, ctx: RunContext, wait: bool) -> str:
    """Store the node's artifact, its upstream being stored: COMPUTED, or REUSED when it is
    stored already; while another live process holds the node, wait for it when `wait`, else
    return BUSY at once. The one computation of a node, whoever runs it (sequentially, a local
    worker, a Ray task)."""
    store, key = ctx.store, node.key
    if store.exists(node.stage, key):
        store.drop_stale_lock(node.stage, key)
        environment = store.attrs(node.stage, key).get("environment")
        note = provenance.reuse_note(environment, ctx.spec.runtime)
        line = f"{node.stage} {key[:12]}: reusing the stored artifact{note}"
        style = "" if note else "dim"  # a reuse across environments stands out
        ctx.console.print(line, style=style, markup=False, soft_wrap=True)
        return REUSED
    _raise_recorded_divergence(node, ctx)
    lease = store.lock(node.stage, key) if wait else store.try_lock(node.stage, key)
    if lease is None:
        return BUSY
    with lease as held:
        if store.exists(node.stage, key):  # another process finished it while we waited
            ctx.console.print(f"[dim]{node.stage} {key[:12]}: reusing (computed meanwhile)[/dim]")
            return REUSED
        if held.took_over is not None:
            ctx.console.print(
                f"{node.stage} {key[:12]}: taking over the stale lock of "
                f"{held.took_over.describe()}",
                markup=False,
            )
        _compute_locked(node, ctx)
    return COMPUTED


def _raise_recorded_divergence(node: StageNode, ctx: RunContext) -> None:
    """A node that diverged when it last ran has that divergence as its result: raise it again
    (announced in one line) rather than compute it again; `fedhet train --retry-diverged`
    forgets it first."""
    diverged = divergence.recorded(ctx.store.partial_dir(node.stage, node.key))
    if diverged is None:
        return
    ctx.console.print(
        f"{node.stage} {node.key[:12]}: diverged in round {diverged.round_number} when last "
        "run (recorded; --retry-diverged computes it again)",
        markup=False,
        soft_wrap=True,
    )
    raise diverged


def _compute_locked(node: StageNode, ctx: RunContext) -> None:
    store, key = ctx.store, node.key
    partial = store.partial_dir(node.stage, key)
    load_stages()
    if node.stage not in PROGRESS:  # one that resumes announces itself
        announce(node, ctx)
    provenance.use_threads(ctx.spec.runtime.threads)
    allocator.keep_freed_memory()
    attrs = {
        "config": node.config,
        "version": node.version,
        "upstream": {role: up.key for role, up in node.upstream.items()},
        "spec_name": ctx.spec.name,
        "label": ctx.labels.get(key, ""),
        "spec": ctx.spec.model_dump(mode="json", serialize_as_any=True),  # as run
    }
    try:
        with damage_named(), store.write(node.stage, key, attrs) as out:
            runner(node.stage)(node, ctx, out, partial)
    except Interrupted as stop:
        stop.in_stage(f"{node.stage} {key[:12]}")
        raise
    except DivergedError as error:  # a result: kept for report, export and eval
        error.key = key
        divergence.record(partial, error)
        release_frames(error)
        raise
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        raise _disk_full(node, ctx, partial) from None


def _disk_full(node: StageNode, ctx: RunContext, partial: Path) -> RunError:
    """The device filled up while the node wrote its checkpoint or artifact (whose temporary the
    writer removed): what to do, and where the same command will go on from."""
    probe = PROGRESS.get(node.stage)
    resumed = probe(node, partial) if probe is not None and partial.exists() else None
    where = f"resumes {resumed}, its last checkpoint" if resumed else "starts again (no checkpoint)"
    return RunError(
        f"{node.stage} {node.key[:12]}: no space left on the device of {ctx.store.root}; free "
        f"some space and run the same command: the run {where}"
    )
