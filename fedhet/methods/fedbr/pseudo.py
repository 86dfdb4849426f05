"""FedBR pseudo-data: label-agnostic samples shared with every client (paper Section 4.2).

- RSM (Random Sample Mean, Algorithm 2): each pseudo sample is the mean of `subset` distinct
  samples of one client, the client drawn uniformly; its label is uniform, 1/C per class.
- Mixture (Eq. 4): the RSM of a proxy dataset (another registered dataset, converted to the
  natural data's shape), mixed at every local step with K samples of the client's own data:
  x~ = (x_p + sum_k x_k) / (K+1),  y~ = (1/C + sum_k onehot(y_k)) / (K+1).

Generation is a pure function of the sample pools and a torch.Generator, so the cached
`pseudo` stage (round 0) and a per-round refresh (round r) draw from the same procedure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedhet.plugin import InputError


@dataclass
class SampleMeans:
    x: torch.Tensor  # N x C x H x W
    source: torch.Tensor  # N: the pool (client) each mean was drawn from
    members: torch.Tensor  # N x subset: indices, within that pool, of the averaged samples


def random_sample_means(
    pools: Sequence[torch.Tensor], count: int, subset: int, gen: torch.Generator
) -> SampleMeans:
    """`count` means of `subset` distinct samples of one pool each, the pool drawn uniformly
    among those holding at least `subset` samples."""
    eligible = [i for i, pool in enumerate(pools) if len(pool) >= subset]
    if not eligible:
        raise InputError(
            f"algorithm.pseudo.subset={subset} exceeds every client's sample count "
            f"(largest {max(len(p) for p in pools)}); lower it"
        )
    picks = torch.randint(len(eligible), (count,), generator=gen)
    sources, members, means = [], [], []
    for pick in picks.tolist():
        pool = pools[eligible[pick]]
        idx = torch.randperm(len(pool), generator=gen)[:subset]
        sources.append(eligible[pick])
        members.append(idx)
        means.append(pool[idx.to(pool.device)].mean(0))
    return SampleMeans(torch.stack(means), torch.tensor(sources), torch.stack(members))


def uniform_labels(count: int, num_classes: int) -> torch.Tensor:
    return torch.full((count, num_classes), 1.0 / num_classes)


def to_shape(x: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
    """Images converted to (channels, height, width): channels averaged or repeated, bilinear
    resize. Both maps are linear, so converting means equals averaging converted samples."""
    channels, height, width = shape
    if x.shape[1] != channels:
        gray = x.mean(1, keepdim=True)
        x = gray.expand(-1, channels, -1, -1) if channels > 1 else gray
    if tuple(x.shape[2:]) != (height, width):
        x = F.interpolate(x, size=(height, width), mode="bilinear", align_corners=False)
    return x.contiguous()


def mix_with_local(
    proxy_x: torch.Tensor,
    local_x: torch.Tensor,
    local_y: torch.Tensor,
    num_classes: int,
    k: int,
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 4: each proxy sample averaged with k random local samples; soft labels to match."""
    soft = uniform_labels(len(proxy_x), num_classes).to(proxy_x.device)
    if k == 0:
        return proxy_x, soft
    idx = torch.randint(len(local_x), (len(proxy_x), k), generator=gen).to(local_x.device)
    x = (proxy_x + local_x[idx].sum(1)) / (k + 1)
    y = (soft + F.one_hot(local_y[idx], num_classes).sum(1)) / (k + 1)
    return x, y


def draw(
    kind: str,
    pools: Sequence[torch.Tensor],
    size: int,
    subset: int,
    shape: tuple[int, int, int],
    gen: torch.Generator,
) -> SampleMeans:
    """One pseudo batch: RSM of the clients' data, or (mixture) the proxy's RSM in `shape`."""
    means = random_sample_means(pools, size, subset, gen)
    if kind == "mixture":
        means.x = to_shape(means.x, shape)
    return means
