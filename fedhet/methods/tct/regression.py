"""TCT stage 2: federated linear regression on standardized eNTK features.

The model predicts W^T z + b with W [p, C] and b [C]. Internally the parameters are one
matrix psi = [W; b] of shape [p + 1, C], the bias being the weight of a constant feature 1,
so Zhat_k = [Z_k, 1]. Client k's loss, with n_k samples and targets Y_k (one-hot minus 1/C):

    L_k(psi) = 1 / (2 n_k) * || Zhat_k psi - Y_k ||_F^2
    grad L_k(psi) = Zhat_k^T (Zhat_k psi - Y_k) / n_k

and the global objective is L = sum_k w_k L_k with w_k = n_k / n unless weights are given
(normalized to sum 1). The paper's Eq. (1) writes L_k without the 1/2; its authors' code
steps with Z^T (Z W - Y) / n_k, i.e. the gradient of this L_k, and the paper's stage-2
learning rate (5e-5) is meant for this scaling.

Algorithms (every round starts from the server model psi_t, psi_0 = 0, all clients take part):
- scaffold: the paper's one-model SCAFFOLD (Appendix A, Algorithm 1). Client k runs M
  full-batch steps psi <- psi - lr * (grad L_k(psi) - h_k); the server averages the local
  models with weights w_k; then every client updates its control
  h_k <- h_k + (psi_{t+1} - psihat_k) / (M * lr), which keeps sum_k w_k h_k = 0.
  (Algorithm 1 applies this update when round t+1 begins; under full participation it is the
  same thing.)
- fedavg: the same without controls.
- gd: centralized full-batch gradient descent on the weighted union, M steps per round.

A round's M local steps are an affine map of the round's start, which the default solver
computes exactly (fedhet.methods.tct.closed_form) at the cost of about two explicit steps.
The explicit solver, the reference, takes the M steps one by one, each costing O(n_k p C) from
the features, or O(p^2 C) from the client's Gram statistics (computed once), whichever is
cheaper over the run. All of them give the same iterates up to rounding (float64).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from fedhet.methods.tct.closed_form import ExactSteps
from fedhet.methods.tct.least_squares import LeastSquares, linear_map
from fedhet.plugin import DivergedError, InputError

Algorithm = Literal["scaffold", "fedavg", "gd"]
Solver = Literal["closed_form", "explicit"]
StepForm = Literal["auto", "gram", "explicit"]
RoundCallback = Callable[[int, Tensor, Tensor, list[Tensor]], None]


@dataclass(frozen=True)
class RegressionResult:
    """The fitted model and the run's history."""

    weight: Tensor  # W [p, C]
    bias: Tensor  # b [C]
    train_loss: list[float]  # global objective L at the server model after each round
    controls: list[Tensor] | None  # scaffold: each client's h_k [p + 1, C] after the last round


def centered_one_hot(labels: Tensor, num_classes: int) -> Tensor:
    """Stage-2 targets: one-hot labels minus 1/C, as float32 [n, C]."""
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise InputError(f"labels must lie in [0, {num_classes}) for {num_classes} classes")
    one_hot = torch.nn.functional.one_hot(labels.to(torch.long), num_classes).to(torch.float32)
    return one_hot - 1.0 / num_classes


def predict(features: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """Predicted labels argmax_j (W^T z + b)_j for each row z of `features`."""
    return (linear_map(features, weight) + bias).argmax(dim=1)


class _ExplicitSteps:
    """The reference: `steps` explicit corrected full-batch steps psi -= lr (grad L(psi) - h),
    with the gradient from the features or from the Gram statistics H, b (computed once)."""

    def __init__(self, problem: LeastSquares, steps: int, lr: float, use_gram: bool) -> None:
        self.problem, self.steps, self.lr = problem, steps, lr
        self.gram = problem.gram() if use_gram else None
        self.moment = problem.moment() if use_gram else None

    def gradient(self, psi: Tensor) -> Tensor:
        if self.gram is not None and self.moment is not None:
            return self.gram @ psi - self.moment
        return self.problem.gradient(psi)

    def run(self, start: Tensor, correction: Tensor, *_fits: Tensor) -> tuple[Tensor, None]:
        psi = start.clone()
        for _ in range(self.steps):
            psi -= self.lr * (self.gradient(psi) - correction)
        return psi, None


def _gram_is_cheaper(count: int, dim: int, classes: int, steps: int) -> bool:
    """Gram: n d^2 once, then d^2 C per step. Explicit: 2 n d C per step."""
    return count * dim * dim + steps * dim * dim * classes < steps * 2 * count * dim * classes


def _stepper(
    problem: LeastSquares, solver: Solver, step_form: StepForm, steps: int, lr: float, rounds: int
) -> ExactSteps | _ExplicitSteps:
    if solver == "closed_form":
        return ExactSteps(problem, steps, lr)
    count, classes = sum(z.shape[0] for z in problem.features), problem.targets[0].shape[1]
    use_gram = step_form == "gram" or (
        step_form == "auto" and _gram_is_cheaper(count, problem.dim, classes, rounds * steps)
    )
    return _ExplicitSteps(problem, steps, lr, use_gram)


def _validated_clients(
    clients: list[tuple[Tensor, Tensor]],
) -> tuple[list[tuple[Tensor, Tensor]], torch.dtype]:
    if not clients:
        raise InputError("stage-2 regression needs at least one client")
    dims = {
        (z.shape[1] if z.ndim == 2 else -1, y.shape[1] if y.ndim == 2 else -1) for z, y in clients
    }
    if len(dims) != 1 or -1 in next(iter(dims)):
        raise InputError(
            "every client's features must be [n_k, p] and targets [n_k, C] with the same p and C"
        )
    for k, (z, y) in enumerate(clients):
        if z.shape[0] != y.shape[0] or z.shape[0] == 0:
            raise InputError(
                f"client {k} has {z.shape[0]} feature rows and {y.shape[0]} target rows; "
                "they must be equal and at least 1"
            )
    dtype = torch.float64 if any(z.dtype == torch.float64 for z, _ in clients) else torch.float32
    return [(z.to(dtype), y.to(dtype)) for z, y in clients], dtype


def _normalized_weights(weights: list[float] | None, counts: list[int]) -> list[float]:
    if weights is None:
        weights = [float(n) for n in counts]
    if len(weights) != len(counts):
        raise InputError(
            f"stage-2 weights must give one value per client ({len(counts)}), got {len(weights)}"
        )
    if any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise InputError("stage-2 weights must be finite, non-negative and not all zero")
    total = sum(weights)
    return [w / total for w in weights]


def _check_schedule(algorithm: str, rounds: int, local_steps: int, lr: float) -> None:
    if algorithm not in ("scaffold", "fedavg", "gd"):
        raise InputError(f"stage-2 algorithm must be scaffold, fedavg or gd, got {algorithm!r}")
    if rounds < 1 or local_steps < 1:
        raise InputError(
            f"stage-2 rounds and local_steps must be >= 1, got {rounds} and {local_steps}"
        )
    if not (math.isfinite(lr) and lr > 0):
        raise InputError(f"stage-2 lr must be a positive number, got {lr}")


def _weighted_sum(tensors: list[Tensor], weights: list[float]) -> Tensor:
    total = torch.zeros_like(tensors[0])
    for tensor, weight in zip(tensors, weights, strict=True):
        total += weight * tensor
    return total


def solve(
    clients: list[tuple[Tensor, Tensor]],
    algorithm: Algorithm = "scaffold",
    rounds: int = 100,
    local_steps: int = 500,
    lr: float = 5e-5,
    weights: list[float] | None = None,
    on_round: RoundCallback | None = None,
    solver: Solver = "closed_form",
    step_form: StepForm = "auto",
    bias: bool = True,
) -> RegressionResult:
    """Fit W, b on the clients' (Z_k [n_k, p], Y_k [n_k, C]) with the chosen federated algorithm.

    The solver works in float64 and returns the model in the features' dtype. `solver`
    "closed_form" computes each round's M local steps exactly from one eigendecomposition per
    client (fedhet.methods.tct.closed_form); "explicit" takes them one by one, with the
    gradient from the features or the Gram statistics as `step_form` says ("auto": the cheaper
    over the run). Without `bias` the model is W alone (b stays 0). `on_round(t, W, b, scores)`
    is called after each round t = 1..rounds with the server model and its training scores
    Zhat_k psi of each client's rows (float64, from the round's fit: no extra pass). Raises
    DivergedError naming the round whose loss is not finite (its metrics are the caller's to
    fill).
    """
    _check_schedule(algorithm, rounds, local_steps, lr)
    clients, dtype = _validated_clients(clients)
    counts = [z.shape[0] for z, _ in clients]
    shares = _normalized_weights(weights, counts)
    targets = [y.to(torch.float64) for _, y in clients]
    union = LeastSquares(
        [z for z, _ in clients], targets, [w / n for w, n in zip(shares, counts, strict=True)], bias
    )
    problems = (
        [union]
        if algorithm == "gd"
        else [
            LeastSquares([z], [y], [1.0 / z.shape[0]], bias)
            for (z, _), y in zip(clients, targets, strict=True)
        ]
    )
    problem_shares = [1.0] if algorithm == "gd" else shares
    movers = [_stepper(p, solver, step_form, local_steps, lr, rounds) for p in problems]
    psi = torch.zeros(union.dim, targets[0].shape[1], dtype=torch.float64)
    controls = [torch.zeros_like(psi) for _ in movers]
    # B_k psi and B_k h_k (B_k = Omega_k^(1/2) Zhat_k), carried so that a round in kernel form
    # passes over the features only twice (fedhet.methods.tct.closed_form)
    fits = [psi.new_zeros(p.rows, psi.shape[1]) for p in problems]
    control_fits = [f.clone() for f in fits]
    losses: list[float] = []
    for round_number in range(1, rounds + 1):
        local = [
            mover.run(psi, h, fit, h_fit)
            for mover, h, fit, h_fit in zip(movers, controls, fits, control_fits, strict=True)
        ]
        models = [model for model, _ in local]
        psi = models[0] if algorithm == "gd" else _weighted_sum(models, shares)
        fits = [problem.root_times(psi) for problem in problems]
        if algorithm == "scaffold":
            for h, h_fit, (model, model_fit), fit in zip(
                controls, control_fits, local, fits, strict=True
            ):
                h += (psi - model) / (local_steps * lr)
                if model_fit is not None:
                    h_fit += (fit - model_fit) / (local_steps * lr)
        loss = sum(
            share * problem.loss_from_root_fit(fit)
            for share, problem, fit in zip(problem_shares, problems, fits, strict=True)
        )
        if not math.isfinite(loss):
            raise DivergedError(
                f"stage-2 {algorithm} diverged at round {round_number}: training loss is {loss}; "
                f"lower the stage-2 lr (now {lr})",
                round_number,
                {},
            )
        losses.append(loss)
        if on_round is not None:
            pairs = zip(problems, fits, strict=True)
            scores = [score for problem, fit in pairs for score in problem.scores(fit, psi)]
            on_round(round_number, *_weight_and_bias(psi, bias, dtype), scores)
    weight, bias_vector = _weight_and_bias(psi, bias, dtype)
    final_controls = [h.to(dtype) for h in controls] if algorithm == "scaffold" else None
    return RegressionResult(weight, bias_vector, losses, final_controls)


def _weight_and_bias(psi: Tensor, bias: bool, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    model = psi.to(dtype)
    if bias:
        return model[:-1], model[-1]
    return model, model.new_zeros(model.shape[1])


def lstsq_loss(clients: list[tuple[Tensor, Tensor]], weights: list[float] | None = None) -> float:
    """The minimum of sum_k w_k L_k, by a direct (rank-revealing) least-squares solve in float64."""
    clients, _ = _validated_clients(clients)
    shares = _normalized_weights(weights, [z.shape[0] for z, _ in clients])
    rows, targets = [], []
    for (z, y), share in zip(clients, shares, strict=True):
        scale = math.sqrt(share / (2 * z.shape[0]))
        with_bias = torch.cat([z, z.new_ones(z.shape[0], 1)], dim=1).to(torch.float64)
        rows.append(scale * with_bias)
        targets.append(scale * y.to(torch.float64))
    design, stacked = torch.cat(rows), torch.cat(targets)
    solution = torch.linalg.lstsq(design, stacked, driver="gelsd").solution
    return float((design @ solution - stacked).square().sum())
