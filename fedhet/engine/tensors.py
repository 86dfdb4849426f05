"""Operations on named tensor dicts (model states, control variates) and their Zarr form."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
import zarr

from fedhet.core.sealed import create_groups

Tensors = dict[str, torch.Tensor]


def clone(tensors: Mapping[str, torch.Tensor]) -> Tensors:
    return {k: v.detach().clone() for k, v in tensors.items()}


def zeros_like(tensors: Mapping[str, torch.Tensor]) -> Tensors:
    return {k: torch.zeros_like(v) for k, v in tensors.items()}


def nbytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def weighted_average(
    states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]
) -> Tensors:
    """sum_i w_i * state_i for floating tensors.

    Integer buffers (BN counters) are taken from the first state.
    """
    out = {}
    for name, first in states[0].items():
        if first.is_floating_point():
            out[name] = sum(w * s[name] for w, s in zip(weights, states, strict=True))
        else:
            out[name] = first.clone()
    return out


def distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """Euclidean norm of a - b over all floating tensors (summed in name order, so the result
    does not depend on the dicts' order, which a checkpoint round trip changes)."""
    total = sum(
        float((a[k] - b[k]).double().square_().sum()) for k in sorted(a) if a[k].is_floating_point()
    )
    return total**0.5


def all_finite(tensors: Mapping[str, torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors.values() if t.is_floating_point())


def arrays(tensors: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The tensors as the arrays `save` stores (fedhet.core.sealed.create_groups writes them)."""
    return {key: value.detach().cpu().numpy() for key, value in tensors.items()}


def save(group: zarr.Group, name: str, tensors: Mapping[str, torch.Tensor]) -> None:
    create_groups(group, {name: arrays(tensors)})


def load(group: zarr.Group, name: str, device: torch.device | str = "cpu") -> Tensors:
    sub = group[name]
    return {
        key: torch.from_numpy(np.asarray(arr[...])).to(device) for key, arr in sorted(sub.arrays())
    }
