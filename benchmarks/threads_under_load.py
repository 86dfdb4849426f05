"""Threads on a busy machine: the default thread count against explicit ones, idle and loaded.

Cross-silo FedAvg, Fashion-MNIST, an MLP 784-200-100-10, 10 clients (Dirichlet 0.5), 60 rounds,
batch 32, test every 10 rounds: `fedhet train` end to end as a subprocess, a fresh store each.
Each setting (the default, `runtime.threads` 1 and every core) runs idle and with a CPU-bound
competitor that this benchmark starts (a Python busy loop, one per `--busy`) and
stops by its PID. Runs alternate so drift hits all alike; the median of `--repeats` is quoted.

Prints each setting's seconds, the loaded default's ratio to its idle time (target <= 1.3) and
to the best explicit thread count under the same load (target <= 1.1).

    .venv/bin/python -m benchmarks.threads_under_load [--repeats 3] [--busy 1] [--rounds 60]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import yaml

from fedhet.process.cores import usable_cores

BUSY_LOOP = "while True: pass"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--busy", type=int, default=1, help="busy cores while loaded")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--dataset", default="fmnist", help="fmnist, or digits where absent")
    parser.add_argument(
        "--clients", help="runtime.clients (default: the spec's, auto, which runs this fused)"
    )
    return parser.parse_args()


def spec_of(threads: int | None, rounds: int, dataset: str, clients: str | None = None) -> dict:
    runtime: dict = {"device": "cpu", "progress": False}
    if clients is not None:
        runtime["clients"] = clients
    if threads is not None:
        runtime["threads"] = threads
    return {
        "name": "threads_under_load",
        "seed": 0,
        "data": {"dataset": dataset},
        "partition": {"scheme": "dirichlet", "clients": 10, "alpha": 0.5},
        "model": {"arch": "mlp", "hidden": [200, 100]},
        "federation": {"rounds": rounds, "batch_size": 32, "lr": 0.05},
        "eval": {"every": 10},
        "runtime": runtime,
    }


def train_seconds(spec: dict, store: Path) -> float:
    """`fedhet train` on a fresh run (the partition is shared and stored by a warm-up)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "spec.yaml"
        path.write_text(yaml.safe_dump(spec))
        runs = Path(folder) / "store"
        subprocess.run(["cp", "-r", str(store), str(runs)], check=True)
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS",)}
        command = [sys.executable, "-m", "fedhet", "train", str(path), "--store", str(runs)]
        started = time.perf_counter()
        subprocess.run(command, check=True, env=env, capture_output=True)
        return time.perf_counter() - started


@contextmanager
def competitors(count: int):
    """`count` CPU-bound processes, stopped by their PIDs on the way out."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(count)]
    time.sleep(0.5)  # running before fedhet measures the free cores
    try:
        yield
    finally:
        for proc in procs:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait()


def warm_store(rounds: int, dataset: str, folder: Path) -> Path:
    """A store holding the partition, so every timed run decodes and trains the same way."""
    store = folder / "warm"
    path = folder / "warm.yaml"
    path.write_text(yaml.safe_dump(spec_of(1, rounds, dataset)))
    command = [sys.executable, "-m", "fedhet", "partition", str(path), "--store", str(store)]
    subprocess.run(command, check=True, capture_output=True)
    return store


def main() -> None:
    args = parse_args()
    every = len(usable_cores())
    settings = {"default": None, "threads 1": 1, f"threads {every}": every}
    print(
        f"FedAvg, {args.dataset} MLP, 10 clients, {args.rounds} rounds, {every} usable cores, "
        f"clients {args.clients or 'default'}; "
        f"loaded = {args.busy} busy-loop process(es); median of {args.repeats}"
    )
    seconds: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        store = warm_store(args.rounds, args.dataset, Path(folder))
        for repeat in range(args.repeats):
            order = list(settings) if repeat % 2 == 0 else list(reversed(settings))
            for load in ("idle", "loaded"):
                for name in order:
                    spec = spec_of(settings[name], args.rounds, args.dataset, args.clients)
                    if load == "idle":
                        took = train_seconds(spec, store)
                    else:
                        with competitors(args.busy):
                            took = train_seconds(spec, store)
                    seconds.setdefault((name, load), []).append(took)
    median = {key: statistics.median(values) for key, values in seconds.items()}
    for name in settings:
        idle, loaded = median[(name, "idle")], median[(name, "loaded")]
        print(f"  {name:10s} idle {idle:6.1f} s   loaded {loaded:6.1f} s   ({loaded / idle:.2f}x)")
    default_loaded = median[("default", "loaded")]
    best = min(median[(name, "loaded")] for name in settings if name != "default")
    print(
        f"loaded default / idle default: {default_loaded / median[('default', 'idle')]:.2f}x "
        f"(target <= 1.3); loaded default / best explicit threads loaded: "
        f"{default_loaded / best:.2f}x (target <= 1.1)"
    )


if __name__ == "__main__":
    main()
