"""Cross-device local training: sequential clients vs one vectorized cohort (torch.func).

Fashion-MNIST, Dirichlet alpha 0.3 over 1,000 clients, FedAvg, 50 clients a round, 1 local
epoch, batch 10, SGD lr 0.05. For each round's jobs (drawn as the engine draws them, from the
initial global model) it times the local training of the 50 clients: the engine's sequential
`train_client`, and `train_cohort` with three ways of handling different step counts (sorted
prefix, masks, buckets of equal step counts). The compute floor is the fwd+bwd of the same
samples as one big batch of one model. Runs alternate so machine load hits all alike; the
vectorized states are checked against the sequential ones.

    .venv/bin/python -m benchmarks.cross_device [--rounds 5] [--arch mlp] [--threads 1]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

from fedhet.core.spec import Spec, parse_spec
from fedhet.data.clients import ClientData
from fedhet.data.datasets import load_dataset
from fedhet.data.partition import make_partition
from fedhet.engine.loop import Checkpoints, Engine, sample_holders
from fedhet.engine.setup import TrainSetup
from fedhet.engine.trainer import ClientJob
from fedhet.engine.vectorized import (
    DEFAULT_BUDGET,
    SGDSettings,
    chunk_size,
    client_inputs,
    train_cohort,
)
from fedhet.models import num_parameters

MODELS = {"mlp": {"arch": "mlp", "hidden": [200, 100]}, "simple_cnn": {"arch": "simple_cnn"}}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds")
    parser.add_argument("--arch", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget-mib", type=int, default=DEFAULT_BUDGET >> 20)
    return parser.parse_args()


def make_engine(arch: str, folder: Path) -> Engine:
    spec: Spec = parse_spec(
        {
            "name": "cross_device",
            "seed": 0,
            "data": {"dataset": "fmnist"},
            "partition": {"scheme": "dirichlet", "clients": 1000, "alpha": 0.3},
            "model": MODELS[arch],
            "federation": {"clients_per_round": 50, "batch_size": 10, "lr": 0.05},
            "runtime": {"device": "cpu", "progress": False},
        }
    )
    ds = load_dataset("fmnist")
    part = make_partition(spec.partition, ds.train_y.numpy(), ds.num_classes, spec.seed)
    clients = [
        ClientData(cid, ds.train_x[index], ds.train_y[index])
        for cid, index in enumerate(map(torch.from_numpy, part.client_indices))
    ]
    setup = TrainSetup(spec, ds, clients, torch.device("cpu"))
    trainer = spec.algorithm.trainer_class()(spec.algorithm, setup)
    return Engine(trainer, setup, Checkpoints(folder, setup.device), 1000)


class Round:
    """One round's jobs, rebuilt fresh (new generators) for every timed run."""

    def __init__(self, engine: Engine, rnd: int):
        self.engine, self.rnd = engine, rnd
        self.state = engine.initial_state()
        self.sampled = sample_holders(
            engine.spec.seed, rnd, engine.holders, engine.setup.clients_per_round
        )

    def jobs(self) -> list[ClientJob]:
        return self.engine.make_jobs(self.rnd, self.state, self.sampled)

    def sequential(self):
        return [self.engine.train_client(job) for job in self.jobs()]

    def vectorized(self, budget: int, masked: bool = False, buckets: bool = False):
        algo, jobs = self.engine.algorithm, self.jobs()
        fed = algo.fed
        inputs = [
            client_inputs(j.client.x, j.client.y, algo.local_steps(j), fed.batch_size, j.generator)
            for j in jobs
        ]
        settings = SGDSettings(jobs[0].lr, fed.momentum, fed.weight_decay)
        groups = defaultdict(list)
        for position, client in enumerate(inputs):
            groups[client.steps if buckets else 0].append(position)
        results = {}
        for positions in groups.values():
            cohort = [inputs[i] for i in positions]
            trained = train_cohort(
                self.engine.model,
                self.state.global_state,
                cohort,
                settings,
                budget=budget,
                masked=masked,
            )
            results.update(zip(positions, trained, strict=True))
        return [results[i] for i in range(len(inputs))]

    def floor(self):
        """fwd+bwd of the round's samples as one batch of one model (the arithmetic alone)."""
        model = self.engine.model
        x = torch.cat([self.engine.setup.clients[c].x for c in self.sampled])
        y = torch.cat([self.engine.setup.clients[c].y for c in self.sampled])
        model.zero_grad()
        F.cross_entropy(model(x), y).backward()
        return len(y)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    budget = args.budget_mib << 20
    with tempfile.TemporaryDirectory() as folder:
        engine = make_engine(args.arch, Path(folder))
        model = engine.model
        sample = engine.setup.clients[0].x[0]
        size = chunk_size(model, sample, 10, 0, budget)
        rounds = [Round(engine, r) for r in range(args.rounds)]
        samples = [sum(engine.setup.clients[c].n for c in r.sampled) for r in rounds]
        print(
            f"FedAvg, Fashion-MNIST, dirichlet 0.3 over 1000 clients, 50 a round, batch 10, "
            f"{args.arch} ({num_parameters(model):,} parameters), threads "
            f"{torch.get_num_threads()}; {args.rounds} rounds, {sum(samples) / len(samples):.0f} "
            f"samples a round; chunk size {size} clients from a {args.budget_mib} MiB budget"
        )
        runs = {
            "sequential": lambda r: r.sequential(),
            "vectorized (prefix)": lambda r: r.vectorized(budget),
            "vectorized (masks)": lambda r: r.vectorized(budget, masked=True),
            "vectorized (buckets)": lambda r: r.vectorized(budget, buckets=True),
            "floor (one batch)": lambda r: r.floor(),
        }
        seconds: dict[str, float] = defaultdict(float)
        worst = 0.0
        for i, rnd in enumerate(rounds):
            order = list(runs) if i % 2 == 0 else list(reversed(runs))
            out = {}
            for name in order:
                engine.model.load_state_dict(rnd.state.global_state)
                started = time.perf_counter()
                out[name] = runs[name](rnd)
                seconds[name] += time.perf_counter() - started
            for seq, vec in zip(out["sequential"], out["vectorized (prefix)"], strict=True):
                worst = max(
                    worst, max(float((seq.state[k] - vec.state[k]).abs().max()) for k in seq.state)
                )
        base = seconds["sequential"] / args.rounds
        floor = seconds["floor (one batch)"] / args.rounds
        for name, total in seconds.items():
            per = total / args.rounds
            print(
                f"  {name:22s} {per:7.4f} s/round   speed-up {base / per:5.2f}x   "
                f"{per / floor:6.2f}x the floor"
            )
        print(f"largest |sequential - vectorized| over the rounds' client states: {worst:.2e}")
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak resident memory of this process: {peak:.0f} MiB")


if __name__ == "__main__":
    main()
