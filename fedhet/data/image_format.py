"""The input format of fedhet's image datasets (the spec's `data.channels`, `data.resize`,
`data.scale`), applied here, in this one place, so every stage sees the same tensors: pixels in
[0, 1], resized bilinearly, then standardized (scale standardize: per-channel mean 0 and std 1
over the training set, the mean and population std computed exactly from the integer pixel
values, or from the resized images when resized) or left in [0, 1] (scale unit), then a grey
channel repeated (an expanded view: no copy)."""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

from fedhet.core.image_data import Pixels

Scale = Literal["standardize", "unit"]


class Formatted(NamedTuple):
    train_x: torch.Tensor  # float32, N x C x H x W
    test_x: torch.Tensor
    mean: tuple[float, ...]  # per channel, in [0, 1] pixel units (unit: 0)
    std: tuple[float, ...]  # (unit: 1)


def formatted(pixels: Pixels, channels: int | None, resize: int | None, scale: Scale) -> Formatted:
    """The images of `pixels` in the input format; `channels` repeat a grey image."""
    train_pixels = torch.from_numpy(pixels.train_pixels)
    test_pixels = torch.from_numpy(pixels.test_pixels)
    train_x = _unit(train_pixels, pixels.max_value)
    test_x = _unit(test_pixels, pixels.max_value)
    if resize is not None:
        train_x, test_x = _resized(train_x, resize), _resized(test_x, resize)
    count = train_x.shape[1]
    mean, std = (0.0,) * count, (1.0,) * count
    if scale == "standardize":
        exact = resize is None  # the integer pixels' histogram describes the images exactly
        mean, std = _channel_stats(train_pixels, pixels.max_value) if exact else _stats(train_x)
        train_x, test_x = _standardize(train_x, mean, std), _standardize(test_x, mean, std)
    wanted = channels or count
    if wanted != count:
        train_x, test_x = _repeated(train_x, wanted), _repeated(test_x, wanted)
        mean, std = mean * wanted, std * wanted
    return Formatted(train_x, test_x, mean, std)


def _channel_stats(
    pixels: torch.Tensor, max_value: int
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Exact per-channel mean and population std, in [0, 1] units, from a value histogram."""
    values = torch.arange(max_value + 1, dtype=torch.float64) / max_value
    means, stds = [], []
    for channel in range(pixels.shape[1]):
        counts = torch.bincount(pixels[:, channel].reshape(-1), minlength=max_value + 1).double()
        probs = counts / counts.sum()
        mean = float((probs * values).sum())
        var = float((probs * (values - mean) ** 2).sum())
        means.append(mean)
        stds.append(max(var, 1e-12) ** 0.5)
    return tuple(means), tuple(stds)


def _stats(x: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and population std of float images (N x C x H x W)."""
    x64 = x.double()
    means = x64.mean(dim=(0, 2, 3))
    stds = x64.var(dim=(0, 2, 3), correction=0).clamp_min(1e-12).sqrt()
    return tuple(means.tolist()), tuple(stds.tolist())


def _unit(pixels: torch.Tensor, max_value: int) -> torch.Tensor:
    return pixels.to(torch.float32).div_(max_value)


def _resized(x: torch.Tensor, side: int) -> torch.Tensor:
    if x.shape[-2:] == (side, side):
        return x
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as tvf

    return tvf.resize(x, [side, side], interpolation=InterpolationMode.BILINEAR, antialias=True)


def _standardize(x: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    x.sub_(torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
    return x.div_(torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))


def _repeated(x: torch.Tensor, channels: int) -> torch.Tensor:
    """A grey batch seen as `channels` equal channels; a view, so no memory is copied."""
    return x.expand(-1, channels, -1, -1)
