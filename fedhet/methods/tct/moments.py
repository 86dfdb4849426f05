"""The normalization round of TCT's eNTK features: streaming per-coordinate moments."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fedhet.plugin import InputError


@dataclass
class FeatureMoments:
    """Streaming per-coordinate mean and (population) variance, accumulated in float64.

    Each client accumulates its own features block by block; the server merges the clients'
    moments (Chan et al.'s pairwise update) into the global mean/std used to standardize
    every client's and the test set's features.
    """

    count: int
    mean: Tensor
    m2: Tensor  # sum of squared deviations from `mean`

    @classmethod
    def empty(cls, dim: int) -> FeatureMoments:
        zeros = torch.zeros(dim, dtype=torch.float64)
        return cls(0, zeros, zeros.clone())

    @classmethod
    def of(cls, block: Tensor) -> FeatureMoments:
        if block.ndim != 2:
            raise InputError(f"feature block must be [samples, p], got shape {tuple(block.shape)}")
        values = block.detach().to(device="cpu", dtype=torch.float64)
        if values.shape[0] == 0:
            return cls.empty(values.shape[1])
        mean = values.mean(dim=0)
        return cls(values.shape[0], mean, ((values - mean) ** 2).sum(dim=0))

    def merge(self, other: FeatureMoments) -> FeatureMoments:
        """Moments of the union of both sample sets."""
        if self.mean.shape != other.mean.shape:
            raise InputError(
                f"cannot merge feature moments of widths {self.mean.numel()}, {other.mean.numel()}"
            )
        total = self.count + other.count
        if total == 0:
            return FeatureMoments(0, self.mean.clone(), self.m2.clone())
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.count / total)
        m2 = self.m2 + other.m2 + delta**2 * (self.count * other.count / total)
        return FeatureMoments(total, mean, m2)

    def update(self, block: Tensor) -> None:
        """Add a block of feature rows in place."""
        merged = self.merge(FeatureMoments.of(block))
        self.count, self.mean, self.m2 = merged.count, merged.mean, merged.m2

    def std(self, floor: float = 1e-6) -> Tensor:
        """Population standard deviation per coordinate, at least `floor` (constant columns)."""
        if self.count == 0:
            raise InputError("feature moments are empty: update them with at least one sample")
        return torch.sqrt(self.m2 / self.count).clamp_min(floor)

    def standardize(self, block: Tensor, floor: float = 1e-6) -> Tensor:
        """(block - mean) / std, in the block's dtype."""
        scaled = (block.detach().cpu().to(torch.float64) - self.mean) / self.std(floor)
        return scaled.to(block.dtype)
