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
In the kernel form the whole round moves in n-dimensional row coordinates: with the fits
f = B psi_0 and f_h = B h (n x C, carried by the caller from round to round), the residual
r = f - Omega^(1/2) Y and K = U S U^T,

    psi_M = psi_0 + M lr h - B^T phi,   phi = M lr r + lr^2 U diag(c) (S U^T r - U^T f_h),
    B psi_M = f + M lr f_h - K phi,

so a round costs one product B^T phi with the features (plus the caller's B psi for the next
round's fit, which also gives the loss): two passes, about one explicit step. c is evaluated
without cancellation for any lr, including rank-deficient (s = 0) and divergent
(|1 - lr s| > 1) directions.
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
        self.kernel_form = problem.rows < problem.dim
        if self.kernel_form:
            self.eigenvalues, self.vectors = torch.linalg.eigh(problem.kernel())
            self.coefficients = flow_coefficients(lr * self.eigenvalues, steps)
            self.root_targets = problem.root_targets()
        else:
            eigenvalues, self.vectors = torch.linalg.eigh(problem.gram())
            self.eigenvalues = eigenvalues
            self.moment = problem.moment()
            self.coefficients = eigenvalues * flow_coefficients(lr * eigenvalues, steps)

    def run(
        self, start: Tensor, correction: Tensor, start_fit: Tensor, correction_fit: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        """(psi_M, B psi_M) from psi_0 = `start` with the fixed correction h: grad L is replaced
        by grad L - h at every step. The fits B psi_0 and B h are used (and B psi_M returned)
        in the kernel form only; the Gram form returns None for B psi_M."""
        if not self.kernel_form:
            return self._run_gram(start, correction), None
        drift = self.steps * self.lr
        residual = start_fit - self.root_targets
        projected = self.vectors.T @ residual
        curved = self.vectors @ (
            self.coefficients[:, None]
            * (self.eigenvalues[:, None] * projected - self.vectors.T @ correction_fit)
        )
        phi = drift * residual + self.lr**2 * curved
        model = start + drift * correction - self.problem.root_transpose_times(phi)
        kernel_phi = self.vectors @ (self.eigenvalues[:, None] * (self.vectors.T @ phi))
        return model, start_fit + drift * correction_fit - kernel_phi

    def _run_gram(self, start: Tensor, correction: Tensor) -> Tensor:
        gradient = self.vectors @ (self.eigenvalues[:, None] * (self.vectors.T @ start))
        direction = gradient - self.moment - correction
        curved = self.vectors @ (self.coefficients[:, None] * (self.vectors.T @ direction))
        return start - self.steps * self.lr * direction - self.lr**2 * curved
