"""Cross-device training: the client executors (runtime.clients), and pfl-research end to end.

Fashion-MNIST, Dirichlet alpha 0.3 over 1,000 clients, FedAvg, 50 clients a round, 1 local
epoch, batch 10, SGD lr 0.05, test every 5 rounds, 30 rounds; an MLP 784-200-100-10 and
simple_cnn. For each model:
- seconds a round: the local training of a round's 50 clients (drawn as the engine draws them,
  from the initial global model) by the engine's sequential `train_client`, `VectorizedExecutor`
  and `FusedExecutor` (MLP); runs alternate so machine load hits all alike; the ratio to the
  compute floor (fwd+bwd of the same samples as one big batch of one model);
- end to end (MLP): `fedhet train` of the whole workload as a subprocess with the spec's
  defaults (executor and threads), the partition stored beforehand, against pfl-research's
  simulator (benchmarks/pfl_reference.py, in its own venv from `make bench-venvs`) on the same
  partition, already decoded and standardized; the two alternate, median of `--repeats`.

    .venv/bin/python -m benchmarks.cross_device [--rounds 5] [--arch mlp simple_cnn] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml

from fedhet.core.spec import parse_spec
from fedhet.engine.client_executors import FusedExecutor, VectorizedExecutor
from fedhet.engine.loop import Engine, sample_holders
from fedhet.engine.trainer import ClientJob, ClientResult
from fedhet.models import num_parameters

MODELS = {"mlp": {"arch": "mlp", "hidden": [200, 100]}, "simple_cnn": {"arch": "simple_cnn"}}
ROOT = Path(__file__).resolve().parents[1]
PFL_PYTHON = ROOT / ".bench" / "pfl" / "bin" / "python"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds")
    parser.add_argument("--arch", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="end-to-end runs of each")
    parser.add_argument("--no-end-to-end", action="store_true", help="time the rounds only")
    return parser.parse_args()


def spec_of(arch: str, clients: str | None = "sequential") -> dict:
    """The workload's spec; `clients` None leaves the executor (and threads) to the defaults."""
    runtime = {"device": "cpu", "progress": False} | ({"clients": clients} if clients else {})
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
        "runtime": runtime,
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
        self.fused_executor = FusedExecutor(engine.algorithm, torch.device("cpu"), print)

    def jobs(self) -> list[ClientJob]:
        return self.engine.make_jobs(self.rnd, self.state, self.sampled)

    def sequential(self) -> list[ClientResult]:
        return [self.engine.train_client(job) for job in self.jobs()]

    def vectorized(self) -> list[ClientResult]:
        return self.executor.map(self.engine.train_client, self.jobs())

    def fused(self) -> list[ClientResult]:
        return self.fused_executor.map(self.engine.train_client, self.jobs())

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
        if timed[0].fused_executor.reason is None:
            runs["fused"] = Round.fused
        runs["floor (one batch)"] = Round.floor
        warm_up = Round(engine, rounds)  # first calls initialize autograd, optimizers, caches
        for run in runs.values():
            run(warm_up)
        seconds: dict[str, float] = defaultdict(float)
        worst = 0.0
        for i, rnd in enumerate(timed):
            out = {}
            for name in list(runs) if i % 2 == 0 else list(reversed(runs)):
                started = time.perf_counter()
                out[name] = runs[name](rnd)
                seconds[name] += time.perf_counter() - started
            for name in ("vectorized", "fused"):
                for seq, other in zip(out["sequential"], out.get(name, []), strict=False):
                    gaps = [float((seq.state[k] - other.state[k]).abs().max()) for k in seq.state]
                    worst = max(worst, *gaps)
        per = {name: total / rounds for name, total in seconds.items()}
        for name in runs:
            speed_up, floor = per["sequential"] / per[name], per[name] / per["floor (one batch)"]
            print(
                f"  {name:18s} {per[name]:7.4f} s/round   speed-up {speed_up:5.2f}x   "
                f"{floor:6.2f}x the floor"
            )
        print(f"  largest |sequential - other executor| over the client states: {worst:.2e}")
        return per


def export_partition(engine: Engine, path: Path) -> None:
    """The clients' data in order (client c: rows offsets[c]:offsets[c+1]) and the test set,
    as fedhet trains on them, for pfl_reference.py."""
    clients, dataset = engine.setup.clients, engine.setup.dataset
    arrays = {
        "x": torch.cat([c.x for c in clients]).contiguous().numpy(),
        "y": torch.cat([c.y for c in clients]).numpy(),
        "offsets": torch.tensor([0] + [c.n for c in clients]).cumsum(0).numpy(),
        "test_x": dataset.test_x.contiguous().numpy(),
        "test_y": dataset.test_y.numpy(),
    }
    with path.open("wb") as file:
        np.savez(file, **arrays)


# Both sides import their code compiled, as an installed package does (this environment may set
# PYTHONDONTWRITEBYTECODE: fedhet, installed editable, would compile every module at each start).
BYTECODE = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def fedhet_train(spec: Path, partitioned: Path, folder: Path) -> tuple[float, float]:
    """(seconds of `fedhet train` on a copy of the partitioned store, final test accuracy %)."""
    store = folder / "store"
    subprocess.run(["rm", "-rf", str(store)], check=True)
    subprocess.run(["cp", "-r", str(partitioned), str(store)], check=True)
    command = [sys.executable, "-m", "fedhet", "train", str(spec), "--store", str(store)]
    command += ["--format", "json"]
    started = time.perf_counter()
    done = subprocess.run(command, check=True, capture_output=True, text=True, env=BYTECODE)
    took = time.perf_counter() - started
    return took, 100 * float(json.loads(done.stdout)[0]["final"])


def pfl_train(data: Path) -> tuple[float, float]:
    """(seconds of pfl_reference.py's whole process, final test accuracy %)."""
    script = Path(__file__).with_name("pfl_reference.py")
    started = time.perf_counter()
    done = subprocess.run(
        [str(PFL_PYTHON), str(script), str(data)],
        check=True,
        capture_output=True,
        text=True,
        env=BYTECODE,
    )
    took = time.perf_counter() - started
    return took, 100 * json.loads(done.stdout.splitlines()[-1])["accuracy"]


def against_pfl(repeats: int) -> None:
    """fedhet train with the spec's defaults against pfl-research, end to end, alternating."""
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        spec = folder / "spec.yaml"
        spec.write_text(yaml.safe_dump(spec_of("mlp", clients=None)))
        partitioned = folder / "partitioned"
        command = [sys.executable, "-m", "fedhet", "partition", str(spec), "--store"]
        subprocess.run([*command, str(partitioned)], check=True, capture_output=True)
        engine = Engine.from_spec(parse_spec(spec_of("mlp", None)), folder / "unused")
        export_partition(engine, folder / "data.npz")
        fedhet_train(spec, partitioned, folder)  # untimed: compiles both sides' modules
        pfl_train(folder / "data.npz")
        seconds: dict[str, list[float]] = defaultdict(list)
        accuracy: dict[str, float] = {}
        for repeat in range(repeats):
            order = ("fedhet", "pfl") if repeat % 2 == 0 else ("pfl", "fedhet")
            for name in order:
                if name == "fedhet":
                    took, accuracy[name] = fedhet_train(spec, partitioned, folder)
                else:
                    took, accuracy[name] = pfl_train(folder / "data.npz")
                seconds[name].append(took)
    median = {name: statistics.median(values) for name, values in seconds.items()}
    print(
        f"  end to end, defaults, median of {repeats}: fedhet train {median['fedhet']:.2f} s "
        f"({accuracy['fedhet']:.2f}% test), pfl-research {median['pfl']:.2f} s "
        f"({accuracy['pfl']:.2f}%): pfl / fedhet = {median['pfl'] / median['fedhet']:.2f}x "
        "(target >= 2)"
    )


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
        pass
    elif PFL_PYTHON.exists():
        against_pfl(args.repeats)
    else:
        print(f"  end to end against pfl-research: skipped ({PFL_PYTHON} absent: make bench-venvs)")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak resident memory of this process: {peak:.0f} MiB")


if __name__ == "__main__":
    main()
