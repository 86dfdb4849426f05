"""Cross-device training: sequential clients vs the vectorized executor (runtime.clients).

Fashion-MNIST, Dirichlet alpha 0.3 over 1,000 clients, FedAvg, 50 clients a round, 1 local
epoch, batch 10, SGD lr 0.05, test every 5 rounds, 30 rounds; an MLP 784-200-100-10 and
simple_cnn. For each model:
- seconds a round: the local training of a round's 50 clients (drawn as the engine draws them,
  from the initial global model) by the engine's sequential `train_client` and by
  `VectorizedExecutor`; runs alternate so machine load hits both alike; the ratio to the
  compute floor (fwd+bwd of the same samples as one big batch of one model);
- end to end: `fedhet train` of the whole workload as a subprocess, a fresh store each.

    .venv/bin/python -m benchmarks.cross_device [--rounds 5] [--arch mlp simple_cnn] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

from fedhet.core.spec import parse_spec
from fedhet.engine.client_executors import VectorizedExecutor
from fedhet.engine.loop import Engine, sample_holders
from fedhet.engine.trainer import ClientJob, ClientResult
from fedhet.models import num_parameters

MODELS = {"mlp": {"arch": "mlp", "hidden": [200, 100]}, "simple_cnn": {"arch": "simple_cnn"}}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds")
    parser.add_argument("--arch", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-end-to-end", action="store_true", help="time the rounds only")
    return parser.parse_args()


def spec_of(arch: str, clients: str = "sequential") -> dict:
    return {
        "name": "cross_device",
        "seed": 0,
        "data": {"dataset": "fmnist"},
        "partition": {"scheme": "dirichlet", "clients": 1000, "alpha": 0.3},
        "model": MODELS[arch],
        "federation": {
            "rounds": 30,
            "clients_per_round": 50,
            "local_epochs": 1,
            "batch_size": 10,
            "lr": 0.05,
        },
        "eval": {"every": 5},
        "runtime": {"device": "cpu", "progress": False, "clients": clients},
    }


class Round:
    """One round's jobs, rebuilt fresh (new generators) for every timed run."""

    def __init__(self, engine: Engine, rnd: int):
        self.engine, self.rnd = engine, rnd
        self.state = engine.initial_state()
        self.sampled = sample_holders(
            engine.spec.seed, rnd, engine.holders, engine.setup.clients_per_round
        )
        self.executor = VectorizedExecutor(engine.algorithm, torch.device("cpu"), print)

    def jobs(self) -> list[ClientJob]:
        return self.engine.make_jobs(self.rnd, self.state, self.sampled)

    def sequential(self) -> list[ClientResult]:
        return [self.engine.train_client(job) for job in self.jobs()]

    def vectorized(self) -> list[ClientResult]:
        return self.executor.map(self.engine.train_client, self.jobs())

    def floor(self) -> None:
        """fwd+bwd of the round's samples as one batch of one model (the arithmetic alone)."""
        model = self.engine.model
        x = torch.cat([self.engine.setup.clients[c].x for c in self.sampled])
        y = torch.cat([self.engine.setup.clients[c].y for c in self.sampled])
        model.zero_grad()
        F.cross_entropy(model(x), y).backward()


def time_rounds(arch: str, rounds: int) -> dict[str, float]:
    """Seconds a round of each way to train the clients, and the largest state difference."""
    with tempfile.TemporaryDirectory() as folder:
        engine = Engine.from_spec(parse_spec(spec_of(arch)), Path(folder))
        timed = [Round(engine, r) for r in range(rounds)]
        samples = sum(engine.setup.clients[c].n for r in timed for c in r.sampled) / rounds
        print(
            f"{arch} ({num_parameters(engine.model):,} parameters), {samples:.0f} samples a round"
        )
        runs = {"sequential": Round.sequential, "vectorized": Round.vectorized}
        runs["floor (one batch)"] = Round.floor
        seconds: dict[str, float] = defaultdict(float)
        worst = 0.0
        for i, rnd in enumerate(timed):
            out = {}
            for name in list(runs) if i % 2 == 0 else list(reversed(runs)):
                started = time.perf_counter()
                out[name] = runs[name](rnd)
                seconds[name] += time.perf_counter() - started
            for seq, vec in zip(out["sequential"], out["vectorized"], strict=True):
                gaps = [float((seq.state[k] - vec.state[k]).abs().max()) for k in seq.state]
                worst = max(worst, *gaps)
        per = {name: total / rounds for name, total in seconds.items()}
        for name in runs:
            speed_up, floor = per["sequential"] / per[name], per[name] / per["floor (one batch)"]
            print(
                f"  {name:18s} {per[name]:7.4f} s/round   speed-up {speed_up:5.2f}x   "
                f"{floor:6.2f}x the floor"
            )
        print(f"  largest |sequential - vectorized| over the client states: {worst:.2e}")
        return per


def end_to_end(arch: str, clients: str, threads: int) -> float:
    """Seconds of `fedhet train` on the whole workload, a fresh store."""
    with tempfile.TemporaryDirectory() as folder:
        spec = Path(folder) / "spec.yaml"
        spec.write_text(yaml.safe_dump(spec_of(arch, clients)))
        env = os.environ | {"OMP_NUM_THREADS": str(threads)}
        command = [sys.executable, "-m", "fedhet", "train", str(spec)]
        command += ["--store", str(Path(folder) / "store")]
        started = time.perf_counter()
        subprocess.run(command, check=True, env=env, capture_output=True)
        return time.perf_counter() - started


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    print(
        "FedAvg, Fashion-MNIST, dirichlet 0.3 over 1000 clients, 50 a round, batch 10, "
        f"threads {torch.get_num_threads()}; {args.rounds} timed rounds"
    )
    for arch in args.arch:
        time_rounds(arch, args.rounds)
        if args.no_end_to_end:
            continue
        seconds = {c: end_to_end(arch, c, args.threads) for c in ("sequential", "vectorized")}
        print(
            f"  fedhet train, 30 rounds, end to end: sequential {seconds['sequential']:.1f} s, "
            f"vectorized {seconds['vectorized']:.1f} s "
            f"({seconds['sequential'] / seconds['vectorized']:.2f}x)"
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak resident memory of this process: {peak:.0f} MiB")


if __name__ == "__main__":
    main()
