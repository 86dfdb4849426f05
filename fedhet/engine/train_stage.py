"""The `train` stage: one federated run of one algorithm.

The artifact holds per-round metrics (`metrics/*`), the final and best global models
(`model/final/*`, `model/best/*`), for algorithms with personalized models (FedBN, SiloBN) the
clients' own entries (`model/clients/<id>/*`), and a summary in its attributes.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import zarr
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from fedhet.core import registry
from fedhet.core.pipeline import RunContext, StageNode, stage
from fedhet.core.spec import Spec
from fedhet.data.datasets import Dataset, load_dataset, rotate
from fedhet.data.partition_stage import load_partition, partition_node
from fedhet.engine import tensors
from fedhet.engine.algorithm import Algorithm, TrainSetup
from fedhet.engine.local import ClientData
from fedhet.engine.loop import Checkpoints, Engine, write_client_states, write_metrics
from fedhet.metrics.summary import summarize

VERSION = 1


def train_config(spec: Spec) -> dict:
    config = {
        "seed": spec.seed,
        "model": spec.model.model_dump(mode="json"),
        "federation": spec.federation.model_dump(mode="json"),
        "algorithm": spec.algorithm.model_dump(mode="json"),
        "eval_every": spec.eval.every,
    }
    if spec.partition.rotation is not None:
        config["test_set"] = "rotated_like_clients"
    revision = registry.algorithm(spec.algorithm.name).revision
    if revision:
        config["algorithm_revision"] = revision
    return config


def train_node(spec: Spec, **extra_upstream: StageNode) -> StageNode:
    upstream = {"partition": partition_node(spec), **extra_upstream}
    return StageNode("train", VERSION, train_config(spec), upstream)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        from fedhet.core.errors import InputError

        raise InputError(
            "runtime.device: cuda requested but no CUDA device is available; use auto or cpu"
        )
    return torch.device(name)


def build_setup(spec: Spec, partition_group: zarr.Group) -> TrainSetup:
    """Dataset, clients (with their feature shift applied) and device for a run."""
    if spec.runtime.threads:
        torch.set_num_threads(spec.runtime.threads)
    device = resolve_device(spec.runtime.device)
    ds = load_dataset(spec.data.dataset, spec.data.root, spec.data.download)
    part = load_partition(partition_group)
    clients = []
    for cid, idx in enumerate(part.client_indices):
        x = ds.train_x[torch.from_numpy(idx)]
        if part.angles is not None and part.angles[cid] != 0:
            x = rotate(x, float(part.angles[cid]), ds.mean, ds.std)
        clients.append(ClientData(cid, x.to(device), ds.train_y[torch.from_numpy(idx)].to(device)))
    if part.angles is not None:
        ds = replace(ds, test_x=rotated_like_clients(ds, part.angles))
    ds_device = ds if device.type == "cpu" else _to_device(ds, device)
    return TrainSetup(spec, ds_device, clients, device)


def rotated_like_clients(ds: Dataset, angles: np.ndarray) -> torch.Tensor:
    """The test images, image i rotated by client (i mod K)'s angle.

    With a rotation feature shift the test set covers every client's domain equally, so
    accuracy is the mean over the clients' rotated test domains, as the rotated-data papers report.
    """
    test_x = ds.test_x.clone()
    position = torch.arange(len(test_x))
    for cid, degrees in enumerate(angles):
        members = position % len(angles) == cid
        if degrees != 0:
            test_x[members] = rotate(test_x[members], float(degrees), ds.mean, ds.std)
    return test_x


def _to_device(ds, device):
    return replace(ds, test_x=ds.test_x.to(device), test_y=ds.test_y.to(device))


def make_algorithm(spec: Spec, setup: TrainSetup) -> Algorithm:
    return registry.algorithm(spec.algorithm.name)(spec.algorithm, setup)


@stage("train")
def run(node: StageNode, ctx: RunContext, out: zarr.Group, partial: Path) -> None:
    spec = ctx.spec
    setup = build_setup(spec, ctx.upstream(node, "partition"))
    for role in node.upstream:
        if role != "partition":
            setup.extras[role] = ctx.upstream(node, role)
    algorithm = make_algorithm(spec, setup)
    rounds = spec.federation.rounds
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("round {task.completed}/{task.total}"),
        TextColumn("{task.fields[acc]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=ctx.console,
        disable=not spec.runtime.progress,
        transient=True,
    ) as progress:
        task = progress.add_task(f"{spec.name}: {spec.algorithm.name}", total=rounds, acc="")

        def on_round(rnd: int, row: dict[str, float]) -> None:
            acc = row["test_accuracy"]
            progress.update(task, completed=rnd + 1, acc="" if acc != acc else f"acc {acc:.4f}")

        engine = Engine(
            algorithm,
            setup,
            Checkpoints(partial, setup.device),
            spec.runtime.checkpoint_every,
            on_round,
        )
        state = engine.initial_state()
        progress.update(task, completed=state.round)
        state = engine.run(state)
    write_metrics(out, state.metrics)
    model = out.create_group("model")
    tensors.save(model, "final", state.global_state)
    tensors.save(model, "best", state.best_state or state.global_state)
    if algorithm.personalized:
        write_client_states(model, state.client_states)
    out.attrs["summary"] = summarize(state.metrics, spec.eval.target_accuracy)
