"""Time TCT's batched eNTK extraction against the paper's per-sample loop (Algorithm 3).

Both methods run on the same inputs (the first N Fashion-MNIST training images, or random
1x28x28 inputs when the dataset is unavailable, which the output says), the same
simple_cnn and the same coordinate mask. A third row times plain torch.func
vmap(grad) over all parameters, for reference. Each method runs in its own subprocess;
its peak memory is the growth of that process's peak resident set size
(getrusage ru_maxrss) across the extraction, which includes the [N, p] result itself.
The features of every method are checked against the loop's.

    .venv/bin/python -m benchmarks.entk_speed [--samples 2000] [--p 10000] [--threads 1]
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

METHODS = ("loop", "batched", "vmap_full")


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


def _extract(method: str, model: nn.Module, x: Tensor, coords: Tensor, batch_size: int) -> Tensor:
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
    x, source = _inputs(args.samples, args.seed)
    model = build_model(ModelSpec(arch="simple_cnn"), (1, 28, 28), 10, seed=args.seed)
    reinit_head(model, seed=args.seed + 1)
    coords = coordinate_mask(trainable_parameter_count(model), args.p, seed=args.seed + 2)
    _extract(args.worker, model, x[:4], coords, args.batch_size)  # warm-up, untimed
    before = _peak_rss_mib()
    start = time.perf_counter()
    features = _extract(args.worker, model, x, coords, args.batch_size)
    seconds = time.perf_counter() - start
    peak_growth = _peak_rss_mib() - before
    torch.save(features, args.out)
    report = {"method": args.worker, "seconds": seconds, "peak_rss_growth_mib": peak_growth}
    print(json.dumps({**report, "source": source, "P": trainable_parameter_count(model)}))


def _run_method(method: str, args: argparse.Namespace, out: Path) -> dict:
    command = [sys.executable, "-m", "benchmarks.entk_speed", "--worker", method, "--out", str(out)]
    for flag in ("samples", "p", "batch_size", "threads", "seed"):
        command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=repo)
    if done.returncode != 0:
        raise SystemExit(f"{method} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(args: argparse.Namespace) -> None:
    print(f"torch {torch.__version__}, {args.threads} thread(s), {os.cpu_count()} CPUs")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as folder:
        results = {m: _run_method(m, args, Path(folder) / f"{m}.pt") for m in METHODS}
        loop = torch.load(Path(folder) / "loop.pt")
        for method in METHODS:
            features = torch.load(Path(folder) / f"{method}.pt")
            results[method]["rel_err"] = float((features - loop).norm() / loop.norm())
    first = results["loop"]
    print(f"inputs: {args.samples} {first['source']}; simple_cnn P={first['P']}, p={args.p}")
    print(f"batch size {args.batch_size}; load average after: {os.getloadavg()[0]:.2f}")
    print(f"{'method':<10} {'seconds':>8} {'ms/sample':>10} {'peak RSS +MiB':>14} {'rel err':>9}")
    for method in METHODS:
        row = results[method]
        per_sample = 1000 * row["seconds"] / args.samples
        print(
            f"{method:<10} {row['seconds']:8.2f} {per_sample:10.3f} "
            f"{row['peak_rss_growth_mib']:14.1f} {row['rel_err']:9.1e}"
        )
    for method in ("batched", "vmap_full"):
        print(f"speedup {method} vs loop: {first['seconds'] / results[method]['seconds']:.1f}x")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--p", type=int, default=10_000)
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
