"""The server's share of the training split (`data.server: N`): N training samples held out
before partitioning, so that no client ever holds them.

The N indices are drawn uniformly without replacement by `numpy_rng(seed, "server")`; the
spec's partition scheme then splits the remaining samples among the clients exactly as it
splits a whole training set (its own draws from the seed), and the validation split, if any,
is taken from the clients' shares after that. Every method of a spec with `data.server`
trains on the same clients; a method with server data (FedDF's `server_data: real`) reads the
held-out samples as `TrainSetup.server`, unlabeled. Without `data.server` nothing changes.
"""

from __future__ import annotations

import numpy as np

from fedhet.core.errors import InputError
from fedhet.core.rng import numpy_rng
from fedhet.data.partition import Partition


def server_indices(count: int, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(held out for the server, left for the clients) of `count` training samples, both
    sorted int64 index arrays."""
    if size >= count:
        raise InputError(
            f"data.server: {size} server samples leave none of the {count} training samples "
            "for the clients; lower it"
        )
    server = np.sort(numpy_rng(seed, "server").choice(count, size=size, replace=False))
    return server.astype(np.int64), np.setdiff1d(np.arange(count), server).astype(np.int64)


def on_pool(part: Partition, pool: np.ndarray) -> Partition:
    """`part`, a partition of the samples `pool` (its indices are positions in `pool`), with its
    indices mapped back to the whole training split."""
    assert part.validation_indices is None, "the validation split is taken after the server's"
    mapped = [pool[indices].astype(np.int64) for indices in part.client_indices]
    return Partition(mapped, part.histogram, part.angles)
