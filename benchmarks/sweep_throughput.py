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
    "federation": {"rounds": 150, "batch_size": 16, "lr": 0.05},
    "runtime": {"threads": 1, "progress": False},
    "matrix": {"algorithm.name": ["fedavg", "fedprox", "scaffold", "fednova"], "seed": [0, 1]},
}


def command(work: Path, spec: str, store: str, *flags: str) -> list[str]:
    train = [sys.executable, "-m", "fedhet", "train", str(work / spec), *flags]
    return [*train, "--store", str(work / store), "--format", "json"]


def timed(work: Path, name: str, *flags: str) -> float:
    started = time.perf_counter()
    subprocess.run(command(work, "spec.yaml", name, *flags), check=True, capture_output=True)
    return time.perf_counter() - started


def independent_halves(work: Path) -> float:
    """The machine's ceiling: each seed's half of the matrix in its own sequential process, both
    at once (no scheduler, no shared store): what two cores give this workload at best."""
    for seed in (0, 1):
        half = {**SPEC, "matrix": {**SPEC["matrix"], "seed": [seed]}}
        (work / f"half{seed}.yaml").write_text(yaml.safe_dump(half))
    started = time.perf_counter()
    procs = [
        subprocess.Popen(
            command(work, f"half{seed}.yaml", f"half{seed}"), stdout=subprocess.DEVNULL
        )
        for seed in (0, 1)
    ]
    for proc in procs:
        proc.wait()
    return time.perf_counter() - started


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        (work / "spec.yaml").write_text(yaml.safe_dump(SPEC))
        one = timed(work, "jobs1", "--jobs", "1")
        two = timed(work, "jobs2", "--jobs", "2")
        ray = timed(work, "ray", "--ray")
        fixed = timed(work, "jobs1", "--jobs", "1")  # all stored: start-up and planning only
        ceiling = independent_halves(work)
    runs = 8
    print(f"--jobs 1: {one:.1f} s for {runs} runs; --jobs 2: {two:.1f} s; --ray: {ray:.1f} s")
    print(f"fixed cost (start-up, planning, reusing the {runs} stored runs): {fixed:.1f} s")
    print(f"throughput --jobs 2 / --jobs 1: {one / two:.2f}x (target >= 1.8, ideal 2.0)")
    print(f"throughput --ray / --jobs 1: {one / ray:.2f}x (target >= 1.7)")
    print(
        f"the machine's ceiling (two independent sequential processes): {one / ceiling:.2f}x; "
        f"--jobs 2 reaches {ceiling / two:.0%} of it, --ray {ceiling / ray:.0%}"
    )
    print(
        f"without the fixed cost: --jobs 2 {(one - fixed) / (two - fixed):.2f}x, "
        f"--ray {(one - fixed) / (ray - fixed):.2f}x"
    )
    overhead = (ray - two) / (runs + 2)
    print(f"Ray overhead per node over --jobs 2 (Ray start-up included): {overhead:.2f} s")


if __name__ == "__main__":
    main()
