"""M full-batch gradient steps on a least-squares problem, computed exactly in closed form.

With Hessian H and gradient H psi - b, M steps psi <- psi - lr (grad L(psi) - h) with a fixed
correction h are an affine map of the start psi_0:

    psi_M = psi_0 - F(H) (grad L(psi_0) - h),    F(H) = lr sum_{j<M} (I - lr H)^j
          = psi_0 - (M lr I + lr^2 H c(lr H)) (grad L(psi_0) - h),

with c(x) = sum_{j<M} ((1 - x)^j - 1) / x, finite at x = 0 (it is -M(M-1)/2 there). On H's
null space F is M lr. One eigendecomposition per problem gives F, whatever M and the number
of rounds:
- n >= d rows: H = V diag(s) V^T, [d, d];
- n < d: the kernel K = B B^T = U diag(s) U^T, [n, n], with B = Omega^(1/2) Zhat and H = B^T B,
  and H c(lr H) = B^T U diag(c(lr s)) U^T B (B^T f(B B^T) B = f(B^T B) B^T B).
A step then costs two products with the features (the gradient, and F(H) applied to it in the
kernel form), about two explicit steps. c is evaluated without cancellation for any lr,
including rank-deficient (s = 0) and divergent (|1 - lr s| > 1) directions.
"""

from __future__ import annotations

from math import comb

import torch
from torch import Tensor

from fedhet.methods.tct.least_squares import LeastSquares

_SERIES_BELOW = 1e-3  # |M x| under which c(x) is summed as its Taylor series


def flow_coefficients(x: Tensor, steps: int) -> Tensor:
    """c(x) = sum_{j<M} ((1 - x)^j - 1) / x elementwise, in float64, for M = `steps`."""
    x = x.to(torch.float64)
    small = (steps * x).abs() < _SERIES_BELOW
    # sum_{j<M} C(j, i) = C(M, i + 1); the next term is below 1e-14 relative
    series = sum((-1) ** (i + 1) * float(comb(steps, i + 2)) * x**i for i in range(4))
    safe = torch.where(small, torch.ones_like(x), x)
    contracting = safe < 1  # 1 - x > 0: (1 - x)^M - 1 without cancellation
    log_ratio = torch.log1p(-torch.where(contracting, safe, torch.zeros_like(safe)))
    power_minus_one = torch.where(
        contracting, torch.expm1(steps * log_ratio), (1 - safe) ** steps - 1
    )
    return torch.where(small, series, (-power_minus_one / safe - steps) / safe)


class ExactSteps:
    """The closed form of `steps` corrected full-batch GD steps of size `lr` on `problem`."""

    def __init__(self, problem: LeastSquares, steps: int, lr: float) -> None:
        self.problem, self.steps, self.lr = problem, steps, lr
        rows = sum(z.shape[0] for z in problem.features)
        self.kernel_form = rows < problem.dim
        if self.kernel_form:
            eigenvalues, self.vectors = torch.linalg.eigh(problem.kernel())
            self.coefficients = flow_coefficients(lr * eigenvalues, steps)
        else:
            eigenvalues, self.vectors = torch.linalg.eigh(problem.gram())
            self.eigenvalues = eigenvalues
            self.moment = problem.moment()
            self.coefficients = eigenvalues * flow_coefficients(lr * eigenvalues, steps)

    def gradient(self, psi: Tensor) -> Tensor:
        if self.kernel_form:
            return self.problem.gradient(psi)
        return self.vectors @ (self.eigenvalues[:, None] * (self.vectors.T @ psi)) - self.moment

    def run(self, start: Tensor, correction: Tensor) -> Tensor:
        """psi_M from psi_0 = `start` with the fixed correction h: grad L is replaced by
        grad L - h at every step."""
        direction = self.gradient(start) - correction
        if self.kernel_form:
            projected = self.vectors.T @ self.problem.root_times(direction)
            curved = self.problem.root_transpose_times(
                self.vectors @ (self.coefficients[:, None] * projected)
            )
        else:
            curved = self.vectors @ (self.coefficients[:, None] * (self.vectors.T @ direction))
        return start - self.steps * self.lr * direction - self.lr**2 * curved
