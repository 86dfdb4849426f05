"""The `train` stage: one federated run of one algorithm (its config's trainer).

The artifact holds per-round metrics (`metrics/*`), the final and best global models
(`model/final/*`, `model/best/*`), for algorithms with personalized models (FedBN, SiloBN) the
clients' own entries (`model/clients/`, one table stacked over the clients, see
fedhet.engine.run_format), the state a run with more rounds continues from (`continuation/`,
fedhet.engine.extension), and a summary in its attributes (`extends`: the stored shorter run it
continued, if any).
Its node and key are planned by fedhet.engine.train_plan.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import zarr

from fedhet.core import provenance
from fedhet.core.pipeline import RunContext, StageNode, announce, stage
from fedhet.core.sealed import create_groups
from fedhet.data.partition import empty_clients_note
from fedhet.engine import tensorboard, tensors
from fedhet.engine.client_executors import executor_name
from fedhet.engine.extension import stored_prefix
from fedhet.engine.loop import Engine
from fedhet.engine.progress import round_note, stage_progress
from fedhet.engine.run_format import (
    Checkpoints,
    RunState,
    client_table,
    metric_arrays,
    read_continuation,
    write_continuation,
)
from fedhet.metrics.summary import summarize


def resume_point(node: StageNode, partial: Path) -> str | None:
    """Where a run with a checkpoint in `partial` goes on from, e.g. "from round 4 of 20"."""
    done = Checkpoints(partial).latest_round()
    rounds = node.config["federation"]["rounds"]
    return None if done is None else f"from round {done + 1} of {rounds}"


def start(
    node: StageNode, ctx: RunContext, engine: Engine, out: zarr.Group, partial: Path
) -> RunState:
    """The state the run starts from, announced in one line: its latest checkpoint that reads
    whole (a damaged one is removed and skipped), or the continuation of a stored shorter run of
    the same config when that is further along (recorded in `out`), else round 0; with the
    environments its rounds ran in so far, this one added where it differs
    (fedhet.core.provenance.segments_after)."""
    extension = stored_prefix(node, ctx.spec, ctx.store)
    stored = None
    if extension is not None:
        stored = read_continuation(ctx.store.open(node.stage, extension.key), engine.setup.device)
    state = engine.initial_state(stored)
    announce(node, ctx, None if state is stored else resume_point(node, partial))
    if extension is not None and state is stored:
        ctx.console.print(
            f"train {node.key[:12]}: {extension.describe()} (the stored run of the same config "
            f"with {extension.rounds} rounds)",
            markup=False,
            soft_wrap=True,
        )
        out.attrs["extends"] = {"key": extension.key, "rounds": extension.rounds}
        if not state.environments:  # a continuation stored before it recorded them
            stored_in = ctx.store.attrs(node.stage, extension.key).get("environment")
            state = replace(state, environments=provenance.segments_of(stored_in))
    here = provenance.environment(device=engine.setup.device.type)
    here["clients"] = executor_name(engine.executor)
    return replace(
        state, environments=provenance.segments_after(state.environments, state.round, here)
    )


@stage("train", progress=resume_point)
def run(node: StageNode, ctx: RunContext, out: zarr.Group, partial: Path) -> None:
    spec = ctx.spec
    rounds = spec.federation.rounds
    with stage_progress(ctx.console, spec.runtime.progress, "round") as progress:
        label = ctx.labels.get(node.key) or f"{spec.name}: {spec.algorithm.name}"
        task = progress.add_task(label, total=rounds, note="")
        learning_rates = spec.algorithm.learning_rates(spec)
        events: tensorboard.RoundWriter | None = None  # opened once the first round is known

        def on_round(rnd: int, row: dict[str, float]) -> None:
            acc = row["test_accuracy"]
            progress.update(task, completed=rnd + 1, note=round_note(acc, row["train_loss"]))
            ctx.report(node, rnd + 1, rounds, acc)
            if events is not None:
                events.write(rnd, row, learning_rates[rnd])

        def say(line: str) -> None:
            ctx.console.print(f"train {node.key[:12]}: {line}", markup=False, soft_wrap=True)

        engine = Engine.from_spec(
            spec,
            partial,
            ctx.upstream(node, "partition"),
            extras={
                role: ctx.upstream(node, role) for role in node.upstream if role != "partition"
            },
            on_round=on_round,
            say=lambda line: ctx.console.print(line, markup=False, soft_wrap=True),
            announce=say,
        )
        state = start(node, ctx, engine, out, partial)
        note = empty_clients_note(engine.setup.sizes)
        if note:
            ctx.console.print(note)
        progress.update(task, completed=state.round)
        events = tensorboard.live_writer(ctx, state.round)
        try:
            state = engine.run(state)
        finally:
            if events is not None:
                events.close()
    write_continuation(out, engine.continuation)
    parts = {
        "metrics": metric_arrays(state.metrics),
        "model/final": tensors.arrays(state.global_state),
        "model/best": tensors.arrays(state.best_state or state.global_state),
    }
    if spec.algorithm.personalized:
        parts["model/clients"] = client_table(state.client_states)
    create_groups(out, parts)  # one trip into zarr's event loop
    out.update_attributes(
        {
            "environment": {  # completed by the store
                "clients": executor_name(engine.executor),
                **provenance.earlier_of(state.environments),
            },
            "summary": summarize(state.metrics, spec.eval.target_accuracy),
        }
    )
