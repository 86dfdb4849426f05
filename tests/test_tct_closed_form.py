"""Stage 2 in closed form: the exact M-step map equals explicit stepping (float64)."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from fedhet.core.errors import RunError
from fedhet.methods.tct.closed_form import flow_coefficients
from fedhet.methods.tct.regression import centered_one_hot, solve

torch.set_num_threads(1)


def _clients(
    sizes: tuple[int, ...], dim: int, rank: int | None = None, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One class per client, features clustered per client; with `rank`, every client's
    features lie in a shared `rank`-dimensional subspace (duplicate columns and rows too)."""
    generator = torch.Generator().manual_seed(seed)
    basis = torch.randn(rank or dim, dim, generator=generator, dtype=torch.float64)
    clients = []
    for label, count in enumerate(sizes):
        codes = 2 * torch.randn(1, rank or dim, generator=generator, dtype=torch.float64)
        codes = codes + torch.randn(count, rank or dim, generator=generator, dtype=torch.float64)
        features = codes @ basis if rank else codes
        if rank:
            features[:, -1] = features[:, 0]  # a duplicate column
            features[-1] = features[0]  # a duplicate row
        labels = torch.full((count,), label)
        clients.append((features, centered_one_hot(labels, len(sizes)).double()))
    return clients


def _lr(clients: list[tuple[torch.Tensor, torch.Tensor]], fraction: float) -> float:
    """`fraction` of 2 / (the largest client curvature, bias included)."""
    largest = max(
        float(
            torch.linalg.eigvalsh(
                torch.cat([z, torch.ones(len(z), 1)], 1).T
                @ torch.cat([z, torch.ones(len(z), 1)], 1)
                / len(z)
            ).max()
        )
        for z, _ in clients
    )
    return fraction * 2 / largest


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


CASES = {
    "n_k > p": ((30, 45, 25), 8, None),
    "n_k < p": ((6, 11, 9), 30, None),  # the union too: gd in kernel form
    "rank-deficient": ((14, 9, 12), 16, 5),
}


@pytest.mark.parametrize("algorithm", ["scaffold", "fedavg", "gd"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("steps", [1, 7, 500])
@pytest.mark.parametrize("case", list(CASES))
def test_closed_form_equals_explicit_steps(algorithm: str, bias: bool, steps: int, case: str):
    sizes, dim, rank = CASES[case]
    clients = _clients(sizes, dim, rank)
    lr = _lr(clients, 0.9 if steps < 500 else 0.02)
    runs = {
        solver: solve(
            clients,
            algorithm,
            rounds=3,
            local_steps=steps,
            lr=lr,
            solver=solver,
            bias=bias,
            step_form="explicit",
        )
        for solver in ("closed_form", "explicit")
    }
    closed, explicit = runs["closed_form"], runs["explicit"]
    assert _relative(closed.weight, explicit.weight) < 1e-8
    assert closed.train_loss == pytest.approx(explicit.train_loss, rel=1e-8)
    if bias:
        assert _relative(closed.bias, explicit.bias) < 1e-8
    else:
        assert not closed.bias.any() and not explicit.bias.any()
    if algorithm == "scaffold":
        for mine, reference in zip(closed.controls, explicit.controls, strict=True):
            assert _relative(mine, reference) < 1e-8
    assert explicit.train_loss[-1] < explicit.train_loss[0]  # the runs do move


def test_flow_coefficients_match_the_defining_sum() -> None:
    """c(x) = sum_{j<M} ((1 - x)^j - 1) / x across the series/direct switch, x = 0, x < 0,
    oscillating (1 < x < 2) and divergent (x > 2) steps."""
    x = torch.tensor(
        [0.0, -1e-12, 1e-9, 1e-7, 1.9e-6, 2.1e-6, 1e-4, 0.3, 0.999, 1.0, 1.5, 2.0, 2.01],
        dtype=torch.float64,
    )
    for steps in (1, 2, 7, 500):
        exact = torch.zeros_like(x)
        for i, value in enumerate(x.tolist()):
            if value == 0.0:
                exact[i] = -steps * (steps - 1) / 2
                continue
            q = 1 - Fraction(value)
            exact[i] = float(sum((q**j - 1) / Fraction(value) for j in range(steps)))
        assert torch.allclose(flow_coefficients(x, steps), exact, rtol=1e-11, atol=0)


def test_divergent_lr_raises_in_closed_form_too() -> None:
    clients = _clients((20, 20), 6)
    with pytest.raises(RunError, match=r"round 1\b"):
        solve(clients, "scaffold", rounds=3, local_steps=500, lr=_lr(clients, 3.0))
