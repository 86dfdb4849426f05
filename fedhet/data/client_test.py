"""The `client_test` stage: each client's own test set, drawn from the dataset's TEST split.

With `eval.client_test: {}` (no `per_client`) and data whose test split names its clients (LEAF's
per-user split, fedhet.data.leaf) under `partition: {scheme: natural}`, client k's test set is
every test sample of its own: the data's own split, drawn by nobody.

With `eval.client_test: {per_client: N}`, client k's test set holds N test samples in the label
proportions p_k of its training samples (the partition's histogram row): class c gets N p_kc
samples, rounded by largest remainder, drawn without replacement from the test samples of class c
with client k's own generator (fedhet.core.rng, path "client_test", k). A class with fewer test
samples than its share gives all of them, so such a client's set is smaller than N. Clients draw
independently: two clients may share a test sample (the test split is small next to the training
data, and each set only estimates accuracy under its client's distribution). A client without
training samples gets no test set. Nothing here touches training data, so every test set is
disjoint from every client's training samples.

A fixed size per client (not proportional to its training size) gives every client's accuracy the
same sampling noise, so the worst clients are not merely the smallest.

The artifact holds index arrays into the test split (`indices`, `offsets`, as the partition's).
Its key (fedhet.data.client_test_plan): the partition's key (dataset, partition, seed) and
`per_client`.
Besides `fedhet eval`, a personalized method's train stage reads it (its rounds' test accuracy is
each client's own model on these samples: fedhet.engine.own_evaluation), so it is upstream of
those runs' train stage; no other stage's result depends on it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import zarr

from fedhet.core.natural_clients import grouped
from fedhet.core.pipeline import RunContext, StageNode, stage
from fedhet.core.rng import numpy_rng
from fedhet.core.spec import Spec
from fedhet.data.clients import ClientData
from fedhet.data.datasets import Dataset, load_data
from fedhet.data.feature_shift import ClientDomains
from fedhet.data.partition_format import load_index_lists, load_partition, save_index_lists


@stage("client_test")
def run(node: StageNode, ctx: RunContext, out: zarr.Group, partial: Path) -> None:
    dataset = load_data(ctx.spec.data, seed=ctx.spec.seed)
    histogram = load_partition(ctx.upstream(node, "partition")).histogram
    save_index_lists(out, client_test_indices(ctx.spec, histogram, dataset))


def client_test_indices(spec: Spec, histogram: np.ndarray, dataset: Dataset) -> list[np.ndarray]:
    """Each client's test samples (indices into the test split) for the partition of
    `histogram`: what the stage stores."""
    per_client = spec.eval.client_test.per_client
    if per_client is None:  # the data's own (validated: natural clients, test client ids)
        ids = grouped(dataset.test_client, spec.partition.group)
        return [np.flatnonzero(ids == k) for k in range(len(histogram))]
    return draw_client_tests(histogram, dataset.test_y.numpy(), per_client, spec.seed)


def draw_client_tests(
    histogram: np.ndarray, test_labels: np.ndarray, per_client: int, seed: int
) -> list[np.ndarray]:
    """Per client (a row of the clients x classes `histogram`), sorted indices into the test split
    (see the module docstring)."""
    pools = [np.flatnonzero(test_labels == c) for c in range(histogram.shape[1])]
    available = np.array([len(pool) for pool in pools])
    tests = []
    for client, counts in enumerate(histogram):
        if counts.sum() == 0:
            tests.append(np.zeros(0, dtype=np.int64))
            continue
        wanted = np.minimum(largest_remainder(counts / counts.sum(), per_client), available)
        rng = numpy_rng(seed, "client_test", client)
        drawn = [
            rng.choice(pool, size=n, replace=False) for pool, n in zip(pools, wanted, strict=True)
        ]
        tests.append(np.sort(np.concatenate(drawn)).astype(np.int64))
    return tests


def largest_remainder(shares: np.ndarray, total: int) -> np.ndarray:
    """Integer counts summing to `total`, as close to `shares * total` as rounding allows: the
    floors, plus one for the largest remainders (ties: the lower index)."""
    quotas = shares * total
    counts = np.floor(quotas).astype(np.int64)
    order = np.argsort(-(quotas - counts), kind="stable")
    counts[order[: total - counts.sum()]] += 1
    return counts


def client_test_data(
    spec: Spec, partition: zarr.Group, client_test: zarr.Group, device: torch.device
) -> list[ClientData]:
    """Each client's test samples (from a `client_test` artifact) on `device`, in the client's
    domain with a feature shift (its rotation, its noise, contrast or blur:
    fedhet.data.feature_shift)."""
    ds = load_data(spec.data, seed=spec.seed)
    domains = ClientDomains.of(spec, load_partition(partition).angles, ds)
    return own_test_sets(ds, domains, load_index_lists(client_test), device)


def own_test_sets(
    ds: Dataset, domains: ClientDomains, indices: list[np.ndarray], device: torch.device
) -> list[ClientData]:
    """Client k's test samples at `indices[k]` of the test split, in its domain, on `device`."""
    clients = []
    for cid, idx in enumerate(indices):
        x = domains.apply(ds.test_x[torch.from_numpy(idx)], cid, "client_test")
        clients.append(ClientData(cid, x.to(device), ds.test_y[torch.from_numpy(idx)].to(device)))
    return clients
