"""Sweep throughput: `--jobs 2` and `--ray` (local, 2 CPUs) against `--jobs 1` on a matrix of 8
one-thread digits runs, each timed from a fresh store; prints the ratios measured in one run."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

SPEC = {
    "name": "sweep-bench",
    "data": {"dataset": "digits"},
    "partition": {"scheme": "dirichlet", "clients": 8, "alpha": 0.5},
    "model": {"arch": "mlp", "hidden": [64]},
    "federation": {"rounds": 60, "batch_size": 16, "lr": 0.05},
    "runtime": {"threads": 1, "progress": False},
    "matrix": {"algorithm.name": ["fedavg", "fedprox", "scaffold", "fednova"], "seed": [0, 1]},
}


def timed(work: Path, name: str, *flags: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "fedhet",
            "train",
            str(work / "spec.yaml"),
            *flags,
            "--store",
            str(work / name),
            "--format",
            "json",
        ],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - started


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        (work / "spec.yaml").write_text(yaml.safe_dump(SPEC))
        one = timed(work, "jobs1", "--jobs", "1")
        two = timed(work, "jobs2", "--jobs", "2")
        ray = timed(work, "ray", "--ray")
    runs = 8
    print(f"--jobs 1: {one:.1f} s for {runs} runs; --jobs 2: {two:.1f} s; --ray: {ray:.1f} s")
    print(f"throughput --jobs 2 / --jobs 1: {one / two:.2f}x (target >= 1.8)")
    print(f"throughput --ray / --jobs 1: {one / ray:.2f}x (target >= 1.7)")
    print(f"Ray overhead per node (start-up included): {(ray - two) / (runs + 2):.2f} s")


if __name__ == "__main__":
    main()
