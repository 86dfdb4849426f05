"""The fixed cost of a small `fedhet train`: where the seconds of a tiny digits run go, what
each checkpoint costs, and how far the whole is from its pure compute.

Each run is a fresh process, `python -m fedhet train SPEC` into an empty store, and its seconds
are split at the lines it prints (timed as they arrive): start (interpreter, the command line's
imports, the spec's validation and keys) up to "partition ...: computing"; the partition stage
(the dataset's imports and load, partitioning, the artifact's commit) up to "train ...:
computing"; the rounds (with the trainer's and executor's set-up) up to "round N/N"; and the
end (final writes, the store's commit, the table, exiting). The checkpoint cost is the rounds'
time of the 20-round spec saving after every round, less that of the same spec saving never,
per save. The pure compute is the same rounds of local steps in a bare loop, client by client
(benchmarks.engine_overhead.run_by_hand: SGD, size-weighted average, a final test), timed in
this process after its imports; the engine trains a round's clients fused (fedhet.engine.fused),
so its own "set-up and rounds" can come in under it.

With `--against REF` the same runs use the fedhet package of git revision REF too (extracted to
a temporary folder), alternating with this tree's, and the two are printed side by side. Wall
times on a machine shared with other jobs are noisy: the medians of `--repeats` runs are shown,
with each run's CPU seconds (user + system) beside.

    .venv/bin/python -m benchmarks.run_overhead [--against a9f283c] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

import torch
import yaml

from benchmarks.engine_overhead import make_clients, run_by_hand
from fedhet.core.spec import parse_spec
from fedhet.data.datasets import load_dataset

REPO = Path(__file__).resolve().parents[1]
TINY = {
    "name": "overhead-tiny",
    "seed": 3,
    "data": {"dataset": "digits"},
    "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.5},
    "model": {"arch": "mlp", "hidden": [16]},
    "federation": {"rounds": 3, "batch_size": 32, "lr": 0.05},
    "algorithm": {"name": "fedavg"},
    "runtime": {"threads": 1},
}
CHECKPOINTED_ROUNDS = 20
STAGES = ("start", "partition", "set-up and rounds", "end")
# the lines that end each stage but the last (which ends when the process does)
MARKS = (r"^partition \w+: computing", r"^train \w+: computing", r"round (\d+)/\1 ")
# Modules imported compiled, as an installed package's are (see benchmarks.stored_commands)
BYTECODE = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="a git revision whose fedhet runs beside this tree's")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each spec and code")
    return parser.parse_args()


@dataclass
class Run:
    stages: dict[str, float]  # wall seconds of each stage
    cpu: float  # user + system seconds of the process

    @property
    def total(self) -> float:
        return sum(self.stages.values())


def timed_train(code: Path, spec: Path) -> Run:
    """One `fedhet train` of `spec` with the fedhet package in `code`, into a fresh store."""
    with tempfile.TemporaryDirectory() as store:
        env = BYTECODE | {"PYTHONPATH": str(code), "FEDHET_STORE": store, "PYTHONUNBUFFERED": "1"}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "fedhet", "train", str(spec)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=store,
        )
        assert proc.stdout is not None
        marks, output = [], []
        for line in proc.stdout:
            output.append(line)
            if len(marks) < len(MARKS) and re.search(MARKS[len(marks)], line.strip()):
                marks.append(time.perf_counter())
        if proc.wait() != 0 or len(marks) < len(MARKS):
            raise RuntimeError(f"fedhet train {spec} failed:\n{''.join(output)[-2000:]}")
        ends = [*marks, time.perf_counter()]
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    seconds = [end - start for start, end in zip([started, *ends], ends, strict=False)]
    return Run(dict(zip(STAGES, seconds, strict=True)), cpu)


def extracted(revision: str, into: Path) -> Path:
    """The fedhet package of git `revision`, written under `into`."""
    archive = subprocess.run(
        ["git", "archive", revision, "fedhet"], cwd=REPO, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def write_specs(folder: Path) -> dict[str, Path]:
    """The tiny spec, and the 20-round spec saving after every round and never."""
    specs = {"tiny": TINY}
    for every in (1, CHECKPOINTED_ROUNDS):
        specs[f"every {every}"] = TINY | {
            "name": f"overhead-every-{every}",
            "federation": TINY["federation"] | {"rounds": CHECKPOINTED_ROUNDS},
            "runtime": TINY["runtime"] | {"checkpoint_every": every},
        }
    paths = {}
    for name, spec in specs.items():
        paths[name] = folder / f"{spec['name']}.yaml"
        paths[name].write_text(yaml.safe_dump(spec, sort_keys=False))
    return paths


def floor_seconds(repeats: int) -> float:
    """The tiny spec's rounds of local steps in a bare loop, median wall seconds."""
    torch.set_num_threads(1)
    spec = parse_spec(TINY)
    ds = load_dataset("digits")
    clients = make_clients(spec, ds, 0)
    run_by_hand(spec, ds, clients)  # untimed: torch's first steps set up its kernels
    runs = []
    for _ in range(repeats):
        started = time.perf_counter()
        run_by_hand(spec, ds, clients)
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


def median_run(runs: list[Run]) -> Run:
    stages = {stage: statistics.median(r.stages[stage] for r in runs) for stage in STAGES}
    return Run(stages, statistics.median(r.cpu for r in runs))


def report(codes: dict[str, Path], runs: dict[tuple[str, str], list[Run]], floor: float) -> None:
    medians = {key: median_run(value) for key, value in runs.items()}
    names = list(codes)
    print(f"{'tiny digits run (3 rounds), wall s':36s}" + "".join(f"{n:>14s}" for n in names))
    for stage in STAGES:
        cells = "".join(f"{medians[(n, 'tiny')].stages[stage]:14.3f}" for n in names)
        print(f"  {stage:34s}{cells}")
    print(f"  {'total':34s}" + "".join(f"{medians[(n, 'tiny')].total:14.3f}" for n in names))
    print(
        f"  {'cpu (user + system)':34s}"
        + "".join(f"{medians[(n, 'tiny')].cpu:14.3f}" for n in names)
    )
    ratios = "".join(f"{medians[(n, 'tiny')].total / floor:13.1f}x" for n in names)
    print(f"  {'total / pure compute':34s}{ratios}   (bare loop {floor:.3f} s)")
    per_save = []
    for name in names:
        rounds = {
            e: medians[(name, e)].stages["set-up and rounds"] for e in ("every 1", "every 20")
        }
        per_save.append((rounds["every 1"] - rounds["every 20"]) / (CHECKPOINTED_ROUNDS - 1))
    print(f"  {'one checkpoint (20-round spec)':34s}" + "".join(f"{s:14.3f}" for s in per_save))
    if len(names) == 2:
        before, after = (medians[(n, "tiny")].total for n in names)
        print(f"tiny run: {names[1]} takes {after / before:.2f}x the time of {names[0]}")


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as folder:
        codes = {"this tree": REPO}
        if args.against:
            base = extracted(args.against, Path(folder) / "against")
            codes = {args.against: base} | codes
        specs = write_specs(Path(folder))
        print(
            f"fedhet train in a fresh process and store, median of {args.repeats} "
            f"(runs alternate between the codes); torch threads 1"
        )
        for code in codes.values():  # untimed: writes the compiled modules
            timed_train(code, specs["tiny"])
        runs: dict[tuple[str, str], list[Run]] = {}
        for repeat in range(args.repeats):
            order = list(codes) if repeat % 2 == 0 else list(reversed(codes))
            for name in order:
                for spec_name, spec in specs.items():
                    runs.setdefault((name, spec_name), []).append(timed_train(codes[name], spec))
        report(codes, runs, floor_seconds(args.repeats))


if __name__ == "__main__":
    main()
