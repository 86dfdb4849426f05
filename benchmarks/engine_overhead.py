"""Engine overhead: FedAvg through fedhet's Engine vs a minimal hand-written loop.

Fashion-MNIST, 10 clients, simple_cnn, 1 local epoch per round, full participation. Both
loops take exactly the same SGD steps on the same data: the hand-written loop draws each
client's batches from the same seeded generator, trains with torch.optim.SGD, averages the
client models by size and evaluates the final model on the test set once, as the engine
does with `eval.every = rounds`. The engine also does what it always does (sampling, state
copies, a finiteness check per step, weight divergence, byte accounting, and a checkpoint
every `--checkpoint-every` rounds). Runs alternate (hand, engine, engine, hand, ...) so a
change in machine load hits both alike; the two final models are checked to agree. Both wall
time and this process's CPU time are reported: on a machine shared with other jobs the CPU
time (torch runs on `--threads` threads, 1 by default) is the steadier measure.

To fit in a minute or two on 2 shared CPU cores the defaults use a training subset and a
narrower simple_cnn than the paper's (32/64 channels, 512 units); less compute per step
makes the engine's fixed costs weigh more, so this errs against the engine.

    .venv/bin/python -m benchmarks.engine_overhead [--rounds 2] [--samples 8000]
        [--channels 16 32] [--fc-width 128] [--threads 1] [--partition dirichlet]
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedhet.core.rng import numpy_rng, torch_generator
from fedhet.core.spec import Spec, parse_spec
from fedhet.data.clients import ClientData
from fedhet.data.datasets import Dataset, load_dataset
from fedhet.data.partition import make_partition
from fedhet.engine.loop import Checkpoints, Engine, evaluate
from fedhet.engine.setup import TrainSetup
from fedhet.models import build_model, num_parameters

TARGET_RATIO = 1.15


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds per timed run")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of each loop")
    parser.add_argument("--samples", type=int, default=8000, help="training subset (0: all)")
    parser.add_argument("--channels", type=int, nargs=2, default=[16, 32])
    parser.add_argument("--fc-width", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--partition", choices=["iid", "dirichlet"], default="dirichlet")
    parser.add_argument("--checkpoint-every", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def make_spec(args: argparse.Namespace) -> Spec:
    partition = {"scheme": args.partition, "clients": 10}
    if args.partition == "dirichlet":
        partition["alpha"] = 0.5
    return parse_spec(
        {
            "name": "engine_overhead",
            "seed": args.seed,
            "data": {"dataset": "fmnist"},
            "partition": partition,
            "model": {"arch": "simple_cnn", "channels": args.channels, "fc_width": args.fc_width},
            "federation": {"rounds": args.rounds, "batch_size": args.batch_size, "lr": 0.05},
            "eval": {"every": args.rounds},
            "runtime": {
                "device": "cpu",
                "threads": args.threads,
                "checkpoint_every": args.checkpoint_every,
                "progress": False,
            },
        }
    )


def make_clients(spec: Spec, ds: Dataset, samples: int) -> list[ClientData]:
    subset = np.arange(len(ds.train_y))
    if 0 < samples < len(subset):
        subset = np.sort(numpy_rng(spec.seed, "bench-subset").permutation(subset)[:samples])
    labels = ds.train_y[torch.from_numpy(subset)]
    part = make_partition(spec.partition, labels.numpy(), ds.num_classes, spec.seed)
    clients = []
    for cid, idx in enumerate(part.client_indices):
        rows = torch.from_numpy(subset[idx])
        clients.append(ClientData(cid, ds.train_x[rows], ds.train_y[rows]))
    return clients


def run_engine(spec: Spec, ds: Dataset, clients: list[ClientData]) -> dict[str, torch.Tensor]:
    setup = TrainSetup(spec, ds, list(clients), torch.device("cpu"))
    with tempfile.TemporaryDirectory() as folder:
        checkpoints = Checkpoints(Path(folder), torch.device("cpu"))
        engine = Engine(
            spec.algorithm.trainer_class()(spec.algorithm, setup),
            setup,
            checkpoints,
            spec.runtime.checkpoint_every,
        )
        return engine.run().global_state


def run_by_hand(spec: Spec, ds: Dataset, clients: list[ClientData]) -> dict[str, torch.Tensor]:
    """FedAvg in a few lines: local epochs of SGD, size-weighted average, a final test."""
    fed = spec.federation
    model = build_model(spec.model, ds.shape, ds.num_classes, spec.seed)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    weights = [c.n / sum(c.n for c in clients) for c in clients]
    for rnd in range(fed.rounds):
        average = {k: torch.zeros_like(v) for k, v in global_state.items()}
        for client, weight in zip(clients, weights, strict=True):
            model.load_state_dict(global_state)
            model.train()
            optimizer = torch.optim.SGD(model.parameters(), lr=fed.lr)
            perm = torch.randperm(
                client.n, generator=torch_generator(spec.seed, "local", rnd, client.id)
            )
            for start in range(0, client.n, fed.batch_size):
                idx = perm[start : start + fed.batch_size]
                optimizer.zero_grad()
                F.cross_entropy(model(client.x[idx]), client.y[idx]).backward()
                optimizer.step()
            for name, value in model.state_dict().items():
                average[name] += weight * value
        global_state = average
    model.load_state_dict(global_state)
    evaluate(model, ds.test_x, ds.test_y, spec.runtime.eval_batch_size)
    return global_state


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    spec = make_spec(args)
    ds = load_dataset("fmnist")
    clients = make_clients(spec, ds, args.samples)
    model = build_model(spec.model, ds.shape, ds.num_classes, spec.seed)
    steps = sum(-(-c.n // args.batch_size) for c in clients) * args.rounds
    print(
        f"FedAvg on Fashion-MNIST: {len(clients)} clients ({args.partition}), "
        f"{sum(c.n for c in clients)} training samples, simple_cnn {args.channels} "
        f"fc {args.fc_width} ({num_parameters(model):,} parameters), batch {args.batch_size}, "
        f"1 local epoch, {args.rounds} rounds = {steps} SGD steps per run; "
        f"torch threads {torch.get_num_threads()}, {platform.processor() or platform.machine()}"
    )
    loops = {"hand-written": run_by_hand, "engine": run_engine}
    wall: dict[str, list[float]] = {name: [] for name in loops}
    cpu: dict[str, list[float]] = {name: [] for name in loops}
    finals: dict[str, dict[str, torch.Tensor]] = {}
    for repeat in range(args.repeats):
        order = list(loops) if repeat % 2 == 0 else list(reversed(loops))
        for name in order:
            started, started_cpu = time.perf_counter(), time.process_time()
            finals[name] = loops[name](spec, ds, clients)
            wall[name].append(time.perf_counter() - started)
            cpu[name].append(time.process_time() - started_cpu)
            print(
                f"  run {repeat + 1} {name:12s} wall {wall[name][-1]:7.2f} s   "
                f"cpu {cpu[name][-1]:7.2f} s"
            )
    gap = max(
        float((finals["engine"][k] - finals["hand-written"][k]).abs().max())
        for k in finals["engine"]
    )
    for label, times in (("wall", wall), ("cpu", cpu)):
        hand, engine = sum(times["hand-written"]), sum(times["engine"])
        ratio = engine / hand
        verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
        print(
            f"{label:4s} time: hand-written {hand:7.2f} s   engine {engine:7.2f} s   "
            f"ratio {ratio:.3f} (target <= {TARGET_RATIO}: {verdict})"
        )
    print(f"largest difference between the two final models: {gap:.2e}")


if __name__ == "__main__":
    main()
