"""The object store's cost: the quickstart trained into a local folder and into an S3 bucket
(`rclone serve s3` on loopback, see benchmarks/s3_server.py) side by side, then read back by
`fedhet runs` on a machine with an empty local copy; prints each wall time and the ratio
S3 / local (target: within 1.5x). Each command is a fresh process, as a user runs it.

    .venv/bin/python -m benchmarks.object_store [--rounds 2] [--only algorithm=fedavg]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.s3_server import BUCKET, S3Server

SPEC = Path(__file__).resolve().parents[1] / "specs" / "quickstart.yaml"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", action="append", default=[], help="as fedhet train --only")
    return parser.parse_args()


def seconds(args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    command = [sys.executable, "-m", "fedhet", *args]
    subprocess.run(command, check=True, capture_output=True, env=env)
    return time.perf_counter() - started


def main() -> None:
    args = parse_args()
    spec = [str(SPEC), f"federation.rounds={args.rounds}"]
    spec += [f"--only={only}" for only in args.only]
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        server = S3Server(root / "server")
        server.start()
        try:
            local = os.environ | {"FEDHET_STORE": str(root / "local"), "FEDHET_CACHE": folder}
            remote = os.environ | server.variables(Path(folder), f"s3://{BUCKET}/bench")
            reader = remote | {"FEDHET_CACHE": str(root / "machine-b")}
            warm = local | {"FEDHET_STORE": str(root / "warm-up")}
            seconds(["train", *spec], warm)  # untimed: compiled modules, the decoded dataset
            timed = {
                "train": (seconds(["train", *spec], local), seconds(["train", *spec], remote)),
                "runs, new machine": (
                    seconds(["runs", *spec], local),
                    seconds(["runs", *spec], reader),
                ),
            }
        finally:
            server.stop()
    print(f"quickstart ({' '.join(spec[1:])}): wall time, local folder vs S3 (rclone, loopback)")
    for name, (on_disk, on_s3) in timed.items():
        ratio = on_s3 / on_disk
        print(f"  {name:<18} local {on_disk:7.2f} s   s3 {on_s3:7.2f} s   ratio {ratio:.2f}x")


if __name__ == "__main__":
    main()
