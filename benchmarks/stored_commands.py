"""Commands that only read stored artifacts: how long a user waits for an answer.

The quickstart at 2 rounds is computed once into a fresh store; then each command runs as a
subprocess, `--repeats` times in turn, and the median wall time is printed beside two floors: a
bare Python start, and importing fedhet's command line (what every command pays before it
reads anything). Target: under one second each. Modules import compiled (a first untimed
round writes them), as an installed package's do.

    .venv/bin/python -m benchmarks.stored_commands [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPEC = Path(__file__).resolve().parents[1] / "specs" / "quickstart.yaml"
ROUNDS = "federation.rounds=2"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    return parser.parse_args()


def fedhet(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedhet", *args]


def commands(store: Path) -> dict[str, list[str]]:
    spec, at = str(SPEC), ["--store", str(store)]
    return {
        "python start (floor)": [sys.executable, "-c", "pass"],
        "import fedhet.cli (floor)": [sys.executable, "-c", "import fedhet.cli"],
        "fedhet spec validate": fedhet("spec", "validate", spec, ROUNDS),
        "fedhet plan": fedhet("plan", spec, ROUNDS, *at),
        "fedhet partition (stored)": fedhet("partition", spec, ROUNDS, *at),
        "fedhet train (stored)": fedhet("train", spec, ROUNDS, *at),
        "fedhet runs": fedhet("runs", spec, ROUNDS, *at),
    }


# Modules imported compiled, as an installed package's are (this environment may set
# PYTHONDONTWRITEBYTECODE: fedhet, installed editable, would compile every module at each start).
BYTECODE = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def seconds(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env=BYTECODE)
    return time.perf_counter() - started


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as folder:
        store = Path(folder) / "store"
        subprocess.run(
            fedhet("train", str(SPEC), ROUNDS, "--store", str(store)),
            check=True,
            capture_output=True,
        )
        timed = commands(store)
        for command in timed.values():  # untimed: writes the compiled modules
            seconds(command)
        runs: dict[str, list[float]] = {name: [] for name in timed}
        for _ in range(args.repeats):
            for name, command in timed.items():
                runs[name].append(seconds(command))
    median = {name: statistics.median(values) for name, values in runs.items()}
    floor = median["import fedhet.cli (floor)"]
    print(f"quickstart ({ROUNDS}), fully stored; median of {args.repeats}")
    for name, value in median.items():
        verdict = "" if "floor" in name else ("  ok" if value < 1.0 else "  over 1 s")
        print(f"  {name:28s} {value:6.3f} s   {value / floor:5.2f}x the import floor{verdict}")


if __name__ == "__main__":
    main()
