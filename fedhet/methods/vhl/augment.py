"""The per-draw augmentation of VHL's virtual images (the authors' loader): a random crop of
the image padded by `padding` zeros on every side, and a horizontal flip with probability 1/2.

The padding value is `fill`: 0 for standardized images (padding with the mean, as torchvision's
RandomCrop(padding=4) on normalized tensors); the authors crop their [0, 1] images before
normalizing, so for images scaled by `clamp` black, -0.5 / 0.25, is the faithful fill.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def crop_and_flip(
    images: Tensor, generator: torch.Generator, padding: int = 4, fill: float = 0.0
) -> Tensor:
    """Each image of the (B, C, H, W) batch shifted by an offset drawn uniformly in
    [-padding, padding]^2 (`fill` filling in) and mirrored left-right with probability 1/2."""
    count, channels, height, width = images.shape
    offsets = torch.randint(0, 2 * padding + 1, (2, count), generator=generator)
    flips = torch.rand(count, generator=generator) < 0.5
    padded = F.pad(images, (padding,) * 4, value=fill)
    device = images.device
    rows = (offsets[0, :, None] + torch.arange(height)).to(device)
    columns = torch.arange(width).expand(count, width)
    columns = torch.where(flips[:, None], columns.flip(1), columns)
    columns = (offsets[1, :, None] + columns).to(device)
    return padded[
        torch.arange(count, device=device)[:, None, None, None],
        torch.arange(channels, device=device)[None, :, None, None],
        rows[:, None, :, None],
        columns[:, None, None, :],
    ]
