"""Seeded generators derived from the spec's seed by a path (stage, round, client, purpose).

No global RNG state is used anywhere in fedhet: every random draw comes from one of these.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


def derive_seed(seed: int, *path: int | str) -> int:
    """A 63-bit seed that depends on `seed` and every element of `path`."""
    text = "/".join([str(seed), *map(str, path)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def numpy_rng(seed: int, *path: int | str) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, *path))


def torch_generator(
    seed: int, *path: int | str, device: str | torch.device = "cpu"
) -> torch.Generator:
    import torch  # here: planning and the numpy draws never import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(derive_seed(seed, *path))
    return gen
