"""specs/synthetic.yaml's rounds on each client executor (runtime.clients), side by side.

FedProx's Synthetic benchmark: logistic regression on 30 clients of power-law sizes, 10 a round,
E=20, batch 10, lr 0.01; FedAvg and FedProx (mu 1) on its four data settings. For each of the
eight: seconds a round of local training (the clients of its first `--rounds` rounds, each from
the initial model) by the sequential, vectorized and fused executors
(`benchmarks.cross_device.Round`), alternating so machine load hits all alike, median of
`--repeats`; the ratio to sequential and to a floor: the round's steps as two bare matmuls each
(the forward's addmm and the weight's addmm_ update on pre-split batches: torch's per-call cost,
no softmax, bias or loss). Then the projected CPU time of the paper's 200 rounds x 5 seeds of
all eight, per executor and with `auto`'s (client training only).

    .venv/bin/python -m benchmarks.synthetic_rounds [--rounds 3] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import yaml

from benchmarks.cross_device import Round
from fedhet.core.spec import parse_spec
from fedhet.engine.client_executors import auto_choice
from fedhet.engine.loop import Engine

SPEC = Path(__file__).resolve().parents[1] / "specs" / "synthetic.yaml"
PAPER_RUNS = 200 * 5  # rounds x seeds


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds' clients timed")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each executor")
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args()


def settings() -> list[dict]:
    """The spec's eight runs of seed 0 (its matrix's data x algorithm)."""
    spec = yaml.safe_load(SPEC.read_text())
    matrix = spec.pop("matrix")
    spec["runtime"] = {"device": "cpu", "progress": False}
    return [
        {**spec, "data": data, "algorithm": algorithm}
        for algorithm in matrix["algorithm"]
        for data in matrix["data"]
    ]


def floor(engine: Engine, rnd: Round) -> None:
    """The round's steps as two matmuls each (forward, weight update) on pre-split batches."""
    weight = engine.model.state_dict()["head.weight"].clone()
    for job in rnd.jobs():
        batches = list(engine.algorithm.client_batches(job))
        x = job.client.x.flatten(1)[torch.cat(batches)]
        for h in x.split([len(b) for b in batches]):
            logits = h @ weight.T
            weight.addmm_(logits.T, h, alpha=-1e-9)


def time_setting(spec: dict, rounds: int, repeats: int) -> dict[str, float]:
    """Median seconds of a round's local training by each executor, and the floor, over the
    clients of the first `rounds` rounds (power-law sizes: a round's work varies)."""
    with tempfile.TemporaryDirectory() as folder:
        engine = Engine.from_spec(parse_spec(spec), Path(folder))
        drawn = [Round(engine, r) for r in range(rounds)]
        runs = {
            "sequential": Round.sequential,
            "vectorized": Round.vectorized,
            "fused": Round.fused,
            "floor": lambda rnd: floor(engine, rnd),
        }
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        for repeat in range(repeats):
            for name in list(runs) if repeat % 2 == 0 else list(reversed(runs)):
                started = time.perf_counter()
                for rnd in drawn:
                    runs[name](rnd)
                seconds[name].append((time.perf_counter() - started) / rounds)
        medians = {name: statistics.median(values) for name, values in seconds.items()}
        medians["auto"] = medians[auto_choice(engine.algorithm, engine.model, engine.setup.device)]
        return medians


def _cell(executor: str, per: dict[str, float]) -> str:
    seconds = per[executor]
    ratios = f"{per['sequential'] / seconds:4.1f}x seq, {seconds / per['floor']:4.1f}x floor"
    return f"{executor} {seconds:6.3f} s ({ratios})"


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"{SPEC.name}: seconds a round (10 clients) over rounds 1-{args.rounds}, "
        f"threads {args.threads}, median of {args.repeats}"
    )
    totals = dict.fromkeys(("sequential", "vectorized", "fused", "auto"), 0.0)
    for spec in settings():
        algorithm, data = spec["algorithm"], spec["data"]
        name = (
            f"{algorithm['name']} {' '.join(f'{k}={v}' for k, v in data.items() if k != 'dataset')}"
        )
        per = time_setting(spec, args.rounds, args.repeats)
        totals = {executor: total + per[executor] for executor, total in totals.items()}
        cells = [_cell(executor, per) for executor in ("sequential", "vectorized", "fused")]
        print(f"  {name:28s} " + "  ".join(cells))
    hours = ", ".join(f"{name} {total * PAPER_RUNS / 3600:.1f}" for name, total in totals.items())
    print(f"  CPU hours of client training, 8 settings x 200 rounds x 5 seeds: {hours}")


if __name__ == "__main__":
    main()
