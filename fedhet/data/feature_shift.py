"""Each client's domain: the per-client input transforms of a feature shift.

Client k's inputs are rotated by its angle (`partition.rotation`, fedhet.data.datasets.rotate),
then shifted by `partition.feature_shift` at its level l_k (`FeatureShiftSpec.client_levels`):
- noise: x + l_k e, e ~ N(0, 1) per pixel, in pixel units (pixels in [0, 1]; a standardized
  image gets l_k e / std_c in channel c). e is drawn once per sample, from the generator of the
  path (seed, "feature_shift", split, k) (fedhet.core.rng), so a client's data are the same at
  every load; split is "train", "validation", "test" or "client_test".
- contrast: each image's channel c scaled around its own mean m by 1 - l_k: m + (1 - l_k)(x - m)
  (the same map in pixel units and standardized, an affine map per channel commuting with it).
- blur: torchvision's gaussian_blur with sigma l_k pixels and a kernel of 2 ceil(3 sigma) + 1
  taps on each axis (at most 2 side - 1, as its reflect padding allows); its weights sum to 1, so
  it too commutes with standardizing.
None of them clamps. An angle or level of 0 leaves the inputs untouched, bit for bit.

The test split: the global test set shows test image i in client (i mod K)'s domain, as with
rotation (`ClientDomains.like_clients`), so its accuracy is the mean over the clients' domains;
each client's own test set (`eval.client_test`) is in its domain. The server's samples
(`data.server`) are no client's: untransformed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedhet.core.rng import torch_generator
from fedhet.core.spec import FeatureShiftKind, Spec
from fedhet.data.datasets import Dataset, Interpolation, rotate


def add_noise(
    x: torch.Tensor, level: float, generator: torch.Generator, std: Sequence[float] = (1.0,)
) -> torch.Tensor:
    """`x` plus Gaussian noise of std `level` in pixel units (divided by each channel's `std`)."""
    noise = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
    return x + level * noise / _channel_view(std, x)


def scale_contrast(x: torch.Tensor, level: float) -> torch.Tensor:
    """Each sample's channel scaled by 1 - `level` around its own mean."""
    mean = x.mean(dim=(-2, -1), keepdim=True)
    return mean + (1.0 - level) * (x - mean)


def blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Gaussian blur of a batch (N x C x H x W) with `sigma` pixels on both axes."""
    height, width = x.shape[-2:]
    taps = 2 * math.ceil(3 * sigma) + 1
    kernel = [min(taps, 2 * width - 1), min(taps, 2 * height - 1)]  # torchvision's (x, y)
    from torchvision.transforms import functional as tvf  # imported only where blur is used

    return tvf.gaussian_blur(x, kernel, [sigma, sigma])


def shift(
    x: torch.Tensor,
    kind: FeatureShiftKind,
    level: float,
    generator: torch.Generator,
    std: Sequence[float] = (1.0,),
) -> torch.Tensor:
    """`x` under feature shift `kind` at `level` (`x` itself at level 0)."""
    if level == 0:
        return x
    if kind == "noise":
        return add_noise(x, level, generator, std)
    if kind == "contrast":
        return scale_contrast(x, level)
    return blur(x, level)


def _channel_view(values: Sequence[float], x: torch.Tensor) -> torch.Tensor:
    per_channel = list(values) * x.shape[-3] if len(values) == 1 else list(values)
    return torch.tensor(per_channel, dtype=x.dtype, device=x.device).view(-1, 1, 1)


@dataclass(frozen=True)
class ClientDomains:
    """The clients' input transforms of a run: rotation by `angles[k]`, then `kind` at
    `levels[k]` (either None when the spec has none)."""

    angles: np.ndarray | None
    interpolation: Interpolation
    kind: FeatureShiftKind | None
    levels: np.ndarray | None
    seed: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def of(cls, spec: Spec, angles: np.ndarray | None, ds: Dataset) -> ClientDomains:
        """The domains of `spec` for dataset `ds`, with the partition's rotation `angles`."""
        option = spec.partition.feature_shift
        levels = None
        if option is not None:
            levels = np.asarray(option.client_levels(spec.partition.clients), dtype=np.float64)
        kind = None if option is None else option.kind
        return cls(angles, spec.partition.interpolation, kind, levels, spec.seed, ds.mean, ds.std)

    @property
    def shifted(self) -> bool:
        """Whether any client's inputs are transformed."""
        return self.angles is not None or self.levels is not None

    def apply(self, x: torch.Tensor, client: int, split: str) -> torch.Tensor:
        """`x`, samples of `split` shown to client `client`, in its domain."""
        if self.angles is not None and self.angles[client] != 0:
            x = rotate(x, float(self.angles[client]), self.mean, self.std, self.interpolation)
        if self.levels is not None and self.kind is not None and self.levels[client] != 0:
            generator = torch_generator(self.seed, "feature_shift", split, client)
            x = shift(x, self.kind, float(self.levels[client]), generator, self.std)
        return x

    def like_clients(self, test_x: torch.Tensor) -> torch.Tensor:
        """The test images, image i in client (i mod K)'s domain."""
        shown = self.angles if self.angles is not None else self.levels
        clients = 0 if shown is None else len(shown)
        test_x = test_x.clone()
        position = torch.arange(len(test_x))
        for client in range(clients):
            members = position % clients == client
            if bool(members.any()):
                test_x[members] = self.apply(test_x[members], client, "test")
        return test_x
