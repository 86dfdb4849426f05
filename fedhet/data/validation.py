"""The validation split (`data.validation: f`): a stratified, seeded share of each client's
training samples held out of training.

Client k holding n_c samples of class c holds out floor(f * n_c + 1/2) of them (n_c * f rounded
half up, so between 0 and n_c), drawn without replacement by the generator
`numpy_rng(seed, "validation", k)`. A class with few samples may give none (f = 0.2: a class of
1 or 2 samples gives 0, one of 3 gives 1). The held-out samples never train: the partition
stage applies the split, so every stage built on a partition sees only the remaining ones as
the client's training data.
"""

from __future__ import annotations

import math

import numpy as np

from fedhet.core.rng import numpy_rng
from fedhet.data.partition import Partition


def held_out_count(fraction: float, count: int) -> int:
    """Samples of one class a client holds out: `fraction * count` rounded half up."""
    return math.floor(fraction * count + 0.5)


def split_client(
    indices: np.ndarray, labels: np.ndarray, fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(kept, held out) of one client's sorted `indices`, both sorted, class by class."""
    held = [
        rng.choice(members, size=held_out_count(fraction, len(members)), replace=False)
        for members in (indices[labels[indices] == c] for c in np.unique(labels[indices]))
    ]
    held_out = np.sort(np.concatenate([np.empty(0, np.int64), *held])).astype(np.int64)
    return np.setdiff1d(indices, held_out).astype(np.int64), held_out


def hold_out(part: Partition, labels: np.ndarray, fraction: float, seed: int) -> Partition:
    """`part` whose clients keep only their training samples (the histogram counts those) and
    whose `validation_indices` are the samples each client holds out."""
    labels = np.asarray(labels, dtype=np.int64)
    kept, held = [], []
    for cid, indices in enumerate(part.client_indices):
        train, validation = split_client(
            indices, labels, fraction, numpy_rng(seed, "validation", cid)
        )
        kept.append(train)
        held.append(validation)
    classes = part.histogram.shape[1]
    histogram = np.stack([np.bincount(labels[k], minlength=classes) for k in kept])
    return Partition(kept, histogram.astype(np.int64), part.angles, held)
