"""Time TCT's batched eNTK extraction against the paper's per-sample loop (Algorithm 3).

All methods run on the same inputs (the first N Fashion-MNIST training images, or random
1x28x28 inputs when the dataset is unavailable, which the output says), the paper's
simple_cnn (P = 1.66M) and the same coordinate mask, at each p asked for (default the
benchmark's 10,000 and the paper's 100,000). The floor row is what any batched extraction
must do, one forward pass and the backward pass to every layer's output, measured in the same
run; extraction times are given as ratios to it and to the loop. A last row times plain
torch.func vmap(grad) over all parameters, for reference. Each method runs in fresh
subprocesses, the methods' processes taken in turn so that a slow spell of a shared machine
does not fall on one method only; the best time counts. Peak memory is the growth of a
process's peak resident set size (getrusage ru_maxrss) across the extraction, which includes
the [N, p] result itself.
The features of every method are checked against the loop's.

    .venv/bin/python -m benchmarks.entk_speed [--samples 2000] [--p 10000 100000] [--threads 1]
        [--repeats 3] [--processes 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from fedhet.core.errors import InputError
from fedhet.core.spec import ModelSpec
from fedhet.methods.tct.entk import (
    coordinate_mask,
    entk_features,
    entk_features_loop,
    reinit_head,
    trainable_parameter_count,
)
from fedhet.models import build_model
from fedhet.process import allocator

METHODS = ("floor", "loop", "batched", "vmap_full")


def _inputs(samples: int, seed: int) -> tuple[Tensor, str]:
    try:
        from fedhet.data.datasets import load_dataset

        return load_dataset("fmnist").train_x[:samples], "Fashion-MNIST training images"
    except (ImportError, InputError) as error:
        generator = torch.Generator().manual_seed(seed)
        return torch.randn(samples, 1, 28, 28, generator=generator), f"RANDOM inputs ({error})"


def _vmap_full(model: nn.Module, x: Tensor, coords: Tensor, batch_size: int) -> Tensor:
    """The textbook torch.func recipe: full per-sample gradients, then the mask."""
    model.eval()
    params = {name: param.detach() for name, param in model.named_parameters()}
    buffers = dict(model.named_buffers())

    def first_logit(own: dict[str, Tensor], sample: Tensor) -> Tensor:
        return functional_call(model, (own, buffers), (sample.unsqueeze(0),))[0, 0]

    per_sample = vmap(grad(first_logit), in_dims=(None, 0))
    blocks = []
    for start in range(0, x.shape[0], batch_size):
        grads = per_sample(params, x[start : start + batch_size])
        flat = torch.cat([g.flatten(1) for g in grads.values()], dim=1)
        blocks.append(flat[:, coords])
    return torch.cat(blocks)


def _floor(model: nn.Module, x: Tensor, coords: Tensor, batch_size: int) -> Tensor:
    """What any batched extraction must do: one forward pass and the backward pass to the
    output of every layer with parameters, chunk by chunk; no features (an empty [N, 0])."""
    modules = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    outputs: list[Tensor] = []
    handles = [m.register_forward_hook(lambda _m, _i, out: outputs.append(out)) for m in modules]
    model.eval()
    try:
        with torch.enable_grad():
            for start in range(0, x.shape[0], batch_size):
                outputs.clear()
                logits = model(x[start : start + batch_size])
                torch.autograd.grad(logits[:, 0].sum(), outputs)
    finally:
        for handle in handles:
            handle.remove()
    return x.new_zeros(x.shape[0], 0)


def _extract(method: str, model: nn.Module, x: Tensor, coords: Tensor, batch_size: int) -> Tensor:
    if method == "floor":
        return _floor(model, x, coords, batch_size)
    if method == "loop":
        return entk_features_loop(model, x, coords)
    if method == "batched":
        return entk_features(model, x, coords, batch_size)
    return _vmap_full(model, x, coords, batch_size)


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def worker(args: argparse.Namespace) -> None:
    """Run one method; print a JSON line and save the features for the cross-check."""
    torch.set_num_threads(args.threads)
    allocator.keep_freed_memory()  # as every fedhet stage does, for every method alike
    x, source = _inputs(args.samples, args.seed)
    model = build_model(ModelSpec(arch="simple_cnn"), (1, 28, 28), 10, seed=args.seed)
    reinit_head(model, seed=args.seed + 1)
    (p,) = args.p  # a worker runs one p
    coords = coordinate_mask(trainable_parameter_count(model), p, seed=args.seed + 2)
    _extract(args.worker, model, x[:4], coords, args.batch_size)  # warm-up, untimed
    before = _peak_rss_mib()
    timings = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        features = _extract(args.worker, model, x, coords, args.batch_size)
        timings.append(time.perf_counter() - start)
    seconds = min(timings)
    peak_growth = _peak_rss_mib() - before
    torch.save(features, args.out)
    report = {"method": args.worker, "seconds": seconds, "peak_rss_growth_mib": peak_growth}
    print(json.dumps({**report, "source": source, "P": trainable_parameter_count(model)}))


def _run_method(method: str, args: argparse.Namespace, out: Path) -> dict:
    command = [sys.executable, "-m", "benchmarks.entk_speed", "--worker", method, "--out", str(out)]
    for flag in ("samples", "p", "batch_size", "threads", "seed", "repeats"):
        command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=repo)
    if done.returncode != 0:
        raise SystemExit(f"{method} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _best(rows: Iterable[dict]) -> dict:
    """The fastest of one method's processes, with the largest peak memory of them all."""
    rows = list(rows)
    fastest = min(rows, key=lambda row: row["seconds"])
    return {**fastest, "peak_rss_growth_mib": max(row["peak_rss_growth_mib"] for row in rows)}


def _compare(args: argparse.Namespace) -> None:
    """All methods at one p: seconds, per sample, ratios to the floor and the loop, memory."""
    with tempfile.TemporaryDirectory() as folder:
        runs = [
            {m: _run_method(m, args, Path(folder) / f"{m}.pt") for m in METHODS}
            for _ in range(args.processes)
        ]
        results = {m: _best(run[m] for run in runs) for m in METHODS}
        loop = torch.load(Path(folder) / "loop.pt")
        for method in METHODS[1:]:
            features = torch.load(Path(folder) / f"{method}.pt")
            results[method]["rel_err"] = float((features - loop).norm() / loop.norm())
    first, floor = results["loop"], results["floor"]["seconds"]
    print(f"\ninputs: {args.samples} {first['source']}; simple_cnn P={first['P']}, p={args.p}")
    print(
        f"batch size {args.batch_size}, best of {args.repeats} runs in each of {args.processes}"
        f" processes per method, taken in turn; load {os.getloadavg()[0]:.2f}"
    )
    header = f"{'method':<10} {'seconds':>8} {'ms/sample':>10} {'/floor':>7} {'/loop':>7}"
    print(f"{header} {'peak RSS +MiB':>14} {'rel err':>9}")
    for method in METHODS:
        row = results[method]
        per_sample = 1000 * row["seconds"] / args.samples
        error = f"{row['rel_err']:9.1e}" if "rel_err" in row else f"{'-':>9}"
        print(
            f"{method:<10} {row['seconds']:8.2f} {per_sample:10.3f} {row['seconds'] / floor:7.2f}"
            f" {row['seconds'] / first['seconds']:7.2f} {row['peak_rss_growth_mib']:14.1f} {error}"
        )


def main(args: argparse.Namespace) -> None:
    print(f"torch {torch.__version__}, {args.threads} thread(s), {os.cpu_count()} CPUs")
    print("floor: one batched forward pass + the backward pass to every layer's output")
    print("peak RSS +MiB includes the [N, p] result (N * p * 4 bytes)")
    print("freed memory is kept for reuse (fedhet.process.allocator), as in fedhet's stages")
    for p in args.p:
        _compare(argparse.Namespace(**{**vars(args), "p": p}))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--p", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs; the best counts")
    parser.add_argument(
        "--processes", type=int, default=2, help="fresh processes per method, taken in turn"
    )
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    return parser


if __name__ == "__main__":
    parsed = _parser().parse_args()
    if parsed.worker:
        worker(parsed)
    else:
        main(parsed)
