"""A weighted least-squares problem over blocks of feature rows, evaluated in float64.

    L(psi) = 1/2 sum_k omega_k || Zhat_k psi - Y_k ||_F^2

over blocks k of rows, where Zhat_k = [Z_k, 1] with a bias (else Z_k) and omega_k is the
block's row weight: 1 / n_k for one client's loss L_k, w_k / n_k for the weighted union of
clients. The bias column is never materialized and the feature blocks stay in their own dtype.

Precision: the Gram matrix and the kernel (factorized once) are accumulated in float64. The
products of a round, Zhat psi and Zhat^T E, are taken in the features' own precision (at least
float32; their rounding, ~1e-6, is far below that of float16-stored features) and returned in
float64, where the solvers keep their state. float16 features are converted one slab of rows
or columns at a time, so the extra memory is one slab, never a copy of the features.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

# elements of one converted slab of features: 16 MiB of float64, under the heap's mmap
# threshold (fedhet.process.allocator), so a slab's memory is reused instead of page-faulted
SLAB_ELEMENTS = 1 << 21


def _slab_starts(count: int, width: int) -> tuple[range, int]:
    step = max(1, SLAB_ELEMENTS // max(width, 1))
    return range(0, count, step), step


def linear_map(features: Tensor, weight: Tensor) -> Tensor:
    """Z W, [n, C], in the weight's dtype, taken as (W^T Z^T)^T: with few classes, a wide left
    factor is twice as fast on a CPU as Z W."""
    return (weight.T.contiguous() @ features.to(weight.dtype).T).T


def _product_dtype(z: Tensor) -> torch.dtype:
    return torch.promote_types(z.dtype, torch.float32)


def _slab_starts_for_product(z: Tensor, count: int, width: int) -> tuple[range, int]:
    """One slab, the whole of z, when it is in the product dtype already."""
    if z.dtype == _product_dtype(z):
        return range(0, count, max(count, 1)), max(count, 1)
    return _slab_starts(count, width)


@dataclass
class LeastSquares:
    """Blocks of rows (Z_k [n_k, p], Y_k [n_k, C] float64) with row weights omega_k."""

    features: list[Tensor]
    targets: list[Tensor]
    row_weights: list[float]
    bias: bool = True

    @property
    def rows(self) -> int:
        """n, the number of rows over all blocks."""
        return sum(z.shape[0] for z in self.features)

    @property
    def dim(self) -> int:
        """d, the length of a column of psi: p, plus 1 with the bias."""
        return self.features[0].shape[1] + int(self.bias)

    def _times(self, z: Tensor, psi: Tensor) -> Tensor:
        """Zhat psi, [n, C] in float64, over row slabs."""
        weight = psi[: z.shape[1]].to(_product_dtype(z))
        starts, step = _slab_starts_for_product(z, *z.shape)
        fit = torch.cat(
            [psi.new_zeros(0, psi.shape[1])]
            + [linear_map(z[s : s + step], weight).to(torch.float64) for s in starts]
        )
        return fit + psi[-1] if self.bias else fit

    def _transpose_times(self, blocks: list[Tensor], weights: list[float]) -> Tensor:
        """sum_k weights_k Zhat_k^T E_k, [d, C] in float64, over column slabs."""
        total = torch.zeros(self.dim, blocks[0].shape[1], dtype=torch.float64)
        for z, e, weight in zip(self.features, blocks, weights, strict=True):
            work = _product_dtype(z)
            weighted, columns = (weight * e).T.to(work), total[: z.shape[1]]
            starts, step = _slab_starts_for_product(z, z.shape[1], z.shape[0])
            for c in starts:
                columns[c : c + step] += (weighted @ z[:, c : c + step].to(work)).T
            if self.bias:
                total[-1] += weight * e.sum(dim=0)
        return total

    def residuals(self, psi: Tensor) -> list[Tensor]:
        return [self._times(z, psi) - y for z, y in zip(self.features, self.targets, strict=True)]

    def gradient(self, psi: Tensor) -> Tensor:
        return self._transpose_times(self.residuals(psi), self.row_weights)

    def root_targets(self) -> Tensor:
        """Omega^(1/2) Y over all rows, [n, C]."""
        return self._root_weights()[:, None] * torch.cat(self.targets)

    def loss_from_root_fit(self, fit: Tensor) -> float:
        """L(psi) from the fit Omega^(1/2) Zhat psi (see `root_times`), without a pass over
        the features. From the residual: a Gram form would cancel catastrophically near a zero
        loss."""
        return 0.5 * float((fit - self.root_targets()).square().sum())

    def moment(self) -> Tensor:
        """b = sum_k omega_k Zhat_k^T Y_k, [d, C]; the gradient is H psi - b."""
        return self._transpose_times(self.targets, self.row_weights)

    def gram(self) -> Tensor:
        """H = sum_k omega_k Zhat_k^T Zhat_k, [d, d], streamed over row slabs."""
        gram = torch.zeros(self.dim, self.dim, dtype=torch.float64)
        for z, weight in zip(self.features, self.row_weights, strict=True):
            starts, step = _slab_starts(*z.shape)
            for s in starts:
                slab = z[s : s + step].to(torch.float64)
                if self.bias:
                    slab = torch.cat([slab, slab.new_ones(slab.shape[0], 1)], dim=1)
                gram += weight * (slab.T @ slab)
        return gram

    def _root_weights(self) -> Tensor:
        return torch.cat(
            [
                torch.full((z.shape[0],), weight**0.5, dtype=torch.float64)
                for z, weight in zip(self.features, self.row_weights, strict=True)
            ]
        )

    def kernel(self) -> Tensor:
        """K = Omega^(1/2) Zhat Zhat^T Omega^(1/2) over all n rows, [n, n], streamed over
        column slabs. Its nonzero eigenvalues are H's."""
        root = self._root_weights()
        kernel = torch.outer(root, root) if self.bias else root.new_zeros(len(root), len(root))
        starts, step = _slab_starts(self.features[0].shape[1], len(root))
        for c in starts:
            slab = torch.cat([z[:, c : c + step].to(torch.float64) for z in self.features])
            slab *= root[:, None]
            kernel += slab @ slab.T
        return kernel

    def root_times(self, psi: Tensor) -> Tensor:
        """Omega^(1/2) Zhat psi over all rows, [n, C]."""
        root = self._root_weights()
        return root[:, None] * torch.cat([self._times(z, psi) for z in self.features])

    def scores(self, fit: Tensor, psi: Tensor) -> list[Tensor]:
        """Zhat_k psi of each block, from the fit Omega^(1/2) Zhat psi over all rows (computed
        for a block of weight 0, whose fit is 0)."""
        blocks = torch.split(fit, [z.shape[0] for z in self.features])
        return [
            block / weight**0.5 if weight > 0 else self._times(z, psi)
            for block, z, weight in zip(blocks, self.features, self.row_weights, strict=True)
        ]

    def root_transpose_times(self, stacked: Tensor) -> Tensor:
        """Zhat^T Omega^(1/2) E for E [n, C] over all rows, [d, C]."""
        blocks = list(torch.split(stacked, [z.shape[0] for z in self.features]))
        return self._transpose_times(blocks, [w**0.5 for w in self.row_weights])
