"""Time TCT's stage 2 per round: the closed form against explicit stepping (the reference).

Random standardized features stand in for eNTK features (the cost does not depend on their
values): K clients of n rows each, p coordinates, C classes, one class per client. Reports the
closed form's one-off factorization, its time per round, explicit stepping's time per round
(measured over --explicit-steps local steps and scaled to M, since a round of M explicit
steps is M identical steps), their ratio, and the relative gap between the two models after
one round at M = --explicit-steps (float64, first two clients).

    .venv/bin/python -m benchmarks.stage2_speed [--clients 10] [--rows 600] [--p 10000]
"""

from __future__ import annotations

import argparse
import time

import torch

from fedhet.methods.tct.closed_form import ExactSteps
from fedhet.methods.tct.least_squares import LeastSquares
from fedhet.methods.tct.regression import centered_one_hot, solve


def _clients(args: argparse.Namespace) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [
        (
            torch.randn(args.rows, args.p, generator=generator),
            centered_one_hot(torch.full((args.rows,), k % args.classes), args.classes),
        )
        for k in range(args.clients)
    ]


def _best_of(repeats: int, run) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    clients = _clients(args)
    problems = [LeastSquares([z], [y.double()], [1.0 / len(z)]) for z, y in clients]
    start = time.perf_counter()
    flows = [ExactSteps(problem, args.steps, args.lr) for problem in problems]
    factorization = time.perf_counter() - start
    psi = torch.zeros(problems[0].dim, args.classes, dtype=torch.float64)
    fits = [psi.new_zeros(args.rows, args.classes) for _ in problems]

    def closed_round() -> None:  # the local runs, then the next round's fits (and loss)
        for flow, fit in zip(flows, fits, strict=True):
            flow.run(psi, psi, fit, fit)
            flow.problem.root_times(psi)

    closed = _best_of(args.repeats, closed_round)
    few = args.explicit_steps

    def explicit_steps() -> None:
        for problem in problems:
            step = psi.clone()
            for _ in range(few):
                step -= args.lr * problem.gradient(step)

    explicit = _best_of(args.repeats, explicit_steps) * args.steps / few
    kwargs = {"rounds": 1, "local_steps": few, "lr": args.lr}
    doubles = [(z.double(), y.double()) for z, y in clients[:2]]  # float64 out, to compare
    reference = solve(doubles, solver="explicit", step_form="explicit", **kwargs).weight
    exact = solve(doubles, **kwargs).weight
    gap = float((exact - reference).norm() / reference.norm())
    form = "kernel" if flows[0].kernel_form else "Gram"
    print(
        f"{args.threads} thread(s); {args.clients} clients x {args.rows} rows, p={args.p}, "
        f"C={args.classes}, M={args.steps}, float32 features and products, float64 solver state"
    )
    print(f"closed form ({form} eigendecomposition): factorization {factorization:.2f} s once")
    print(f"closed form: {closed:.3f} s per round (best of {args.repeats})")
    print(f"explicit:    {explicit:.3f} s per round (M={args.steps}, from {few} steps)")
    print(
        f"explicit / closed form per round: {explicit / closed:.0f}x; "
        f"break-even after {factorization / max(explicit - closed, 1e-12):.2f} rounds"
    )
    print(f"relative gap after one round at M={few} (2 clients, float64): {gap:.1e}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rows", type=int, default=600)
    parser.add_argument("--p", type=int, default=10_000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--explicit-steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    return parser


if __name__ == "__main__":
    main(_parser().parse_args())
