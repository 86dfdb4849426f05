"""Checkpoint write time: one group per client in every checkpoint (the layout before
fedhet.engine.run_format's client deltas) against the deltas of the clients touched since the
previous save.

A cross-device run: `--clients` clients already seen, `--touched` of them (drawn at random)
train between two checkpoints, `--checkpoints` saves timed after a first one that both layouts
write whole. Two client states: empty (FedAvg) and a SCAFFOLD-like control variate the size of
an MLP 784-200-100-10. Every resumed state is checked against the one saved.

    .venv/bin/python -m benchmarks.checkpoint_cost [--clients 1000] [--touched 50]
        [--checkpoints 5]
"""

from __future__ import annotations

import argparse
import functools
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import zarr

from fedhet.core.rng import numpy_rng
from fedhet.core.spec import ModelSpec
from fedhet.engine import tensors
from fedhet.engine.run_format import METRICS, Checkpoints, RunState, write_metrics
from fedhet.models import build_model


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000, help="clients seen so far")
    parser.add_argument("--touched", type=int, default=50, help="clients trained between saves")
    parser.add_argument("--checkpoints", type=int, default=5, help="timed saves")
    return parser.parse_args()


def mlp_state() -> tensors.Tensors:
    model = build_model(ModelSpec(arch="mlp", hidden=[200, 100]), (1, 28, 28), 10, seed=0)
    return tensors.clone(model.state_dict())


def save_one_group_per_client(folder: Path, state: RunState) -> None:
    """A checkpoint in the layout before the deltas: everything, every client, every save."""
    final = folder / f"ckpt-{state.round:06d}.zarr"
    tmp = folder / f".tmp-{final.name}"
    group = zarr.open_group(tmp, mode="w")
    group.attrs.update({"round": state.round, "best_accuracy": state.best_accuracy})
    write_metrics(group, state.metrics)
    tensors.save(group, "global", state.global_state)
    tensors.save(group, "server", state.server_state)
    clients = group.create_group("clients")
    for cid, cstate in state.client_states.items():
        tensors.save(clients, str(cid), cstate)
    tmp.rename(final)
    for old in folder.glob("ckpt-*.zarr"):
        if old != final:
            shutil.rmtree(old)


def timed_saves(save, args: argparse.Namespace, client_state) -> tuple[list[float], RunState]:
    """Seconds of each timed save; the same run of touched clients for either layout."""
    model = MODEL
    states = {cid: client_state(cid, 0) for cid in range(args.clients)}
    state = RunState(0, model, tensors.zeros_like(model), states)
    state.metrics = {name: [] for name in METRICS}
    save(state)  # the first save writes every client in either layout
    seconds = []
    for rnd in range(1, args.checkpoints + 1):
        picked = numpy_rng(0, "touched", rnd).choice(args.clients, args.touched, replace=False)
        state.client_states = dict(state.client_states)
        state.client_states.update({int(c): client_state(int(c), rnd) for c in picked})
        state.round = rnd
        for values in state.metrics.values():
            values.append(float(rnd))
        started = time.perf_counter()
        save(state)
        seconds.append(time.perf_counter() - started)
    return seconds, state


MODEL = mlp_state()


def scaffold_control(cid: int, rnd: int) -> tensors.Tensors:
    gen = torch.Generator().manual_seed(cid * 1000 + rnd)
    return {name: torch.randn(t.shape, generator=gen) for name, t in MODEL.items()}


CLIENT_STATES = {"empty (FedAvg)": lambda cid, rnd: {}, "MLP control (SCAFFOLD)": scaffold_control}


def check_resumes(folder: Path, saved: RunState) -> None:
    resumed = Checkpoints(folder).latest()
    assert resumed is not None and resumed.round == saved.round
    assert sorted(resumed.client_states) == sorted(saved.client_states)
    for cid, state in saved.client_states.items():
        assert all(torch.equal(resumed.client_states[cid][k], v) for k, v in state.items())


def main() -> None:
    args = parse_args()
    print(
        f"{args.clients} clients seen, {args.touched} touched between saves, "
        f"{args.checkpoints} timed saves (mean seconds per save)"
    )
    print(f"{'client state':<24} {'one group per client':>21} {'deltas':>8} {'ratio':>7}")
    for label, client_state in CLIENT_STATES.items():
        means = []
        for layout in ("old", "new"):
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp)
                if layout == "old":
                    save = functools.partial(save_one_group_per_client, folder)
                else:
                    save = Checkpoints(folder).save
                seconds, saved = timed_saves(save, args, client_state)
                check_resumes(folder, saved)
            means.append(float(np.mean(seconds)))
        print(f"{label:<24} {means[0]:>20.3f}s {means[1]:>7.3f}s {means[0] / means[1]:>6.1f}x")


if __name__ == "__main__":
    main()
