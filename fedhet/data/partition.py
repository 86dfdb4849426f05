"""Client partitions of a training set: which sample indices each client holds.

Every scheme is deterministic given the seed: all randomness comes from one
np.random.default_rng(seed). Schemes may leave a client empty (e.g. dirichlet with a tiny
alpha and min_samples=0); `min_samples` exists to prevent that. An empty client never trains
(see fedhet.engine.setup.TrainSetup.holders); `empty_clients_note` announces it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fedhet.core.errors import InputError
from fedhet.core.natural_clients import grouped
from fedhet.core.spec import (
    ClassesPartition,
    ClientDirichletPartition,
    DirichletPartition,
    PartitionConfig,
    QuantityPartition,
    SubsetPartition,
)

# Dirichlet draws tried before the deterministic min_samples repair; a bound, not a retry loop.
MAX_DIRICHLET_DRAWS = 10


@dataclass(frozen=True, eq=False)
class Partition:
    client_indices: list[np.ndarray]  # int64 indices into the train set, one per client, sorted
    histogram: np.ndarray  # clients x classes int64 label counts
    angles: np.ndarray | None  # per-client rotation in degrees (feature shift), or None
    # with `data.validation`, the samples each client holds out of training
    # (fedhet.data.validation), sorted; else None
    validation_indices: list[np.ndarray] | None = None
    # with `data.server`, the training samples held out for the server (fedhet.data.server_split)
    server_indices: np.ndarray | None = None

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)


def make_partition(
    spec: PartitionConfig,
    labels: np.ndarray,
    num_classes: int,
    seed: int,
    clients: np.ndarray | None = None,
) -> Partition:
    """Split the training labels among `spec.clients` clients by `spec.scheme`; the natural
    scheme gives client k the samples whose id in `clients` (the data's) is k."""
    labels = np.asarray(labels, dtype=np.int64)
    if labels.ndim != 1 or (labels.size and (labels.min() < 0 or labels.max() >= num_classes)):
        raise ValueError(f"labels must be a 1-D array of values in [0, {num_classes})")
    rng = np.random.default_rng(seed)
    if spec.scheme == "natural":
        shares = _natural(spec.clients, clients, spec.group)
    else:
        shares = _SCHEMES[spec.scheme](spec, labels, num_classes, rng)
    if spec.max_samples is not None:
        shares = [_at_most(share, spec.max_samples, rng) for share in shares]
    client_indices = [np.sort(share).astype(np.int64) for share in shares]
    histogram = np.stack(
        [np.bincount(labels[share], minlength=num_classes) for share in client_indices]
    ).astype(np.int64)
    return Partition(client_indices, histogram, _angles(spec))


def _at_most(share: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """`share` itself when it holds at most `count` indices, else `count` of them at random."""
    if len(share) <= count:
        return share
    return rng.choice(share, size=count, replace=False)


def empty_clients_note(sizes: Sequence[int]) -> str | None:
    """One line saying how many clients hold no samples; None when every client holds some."""
    empty = sum(1 for n in sizes if n == 0)
    if not empty:
        return None
    return f"{empty} of {len(sizes)} clients hold no samples and never train"


def summary_rows(partition: Partition) -> list[dict]:
    """One row per client: size, classes present, dominant class and its share, its label
    distribution's distances to the pooled one (fedhet.data.heterogeneity), angle."""
    from fedhet.data.heterogeneity import client_measures

    rows = []
    measures = client_measures(partition.histogram)
    for client, counts in enumerate(partition.histogram):
        size = int(counts.sum())
        angle = None if partition.angles is None else float(partition.angles[client])
        rows.append(
            {
                "client": client,
                "size": size,
                "classes": int(np.count_nonzero(counts)),
                "dominant_class": int(np.argmax(counts)) if size else None,
                "dominant_share": float(counts.max() / size) if size else 0.0,
                **measures[client],
                "angle": angle,
            }
        )
    return rows


# --- schemes: each returns one index array per client ------------------------------------


def _iid(spec: PartitionConfig, labels: np.ndarray, num_classes: int, rng: np.random.Generator):
    return np.array_split(rng.permutation(len(labels)), spec.clients)


def _dirichlet(
    spec: DirichletPartition, labels: np.ndarray, num_classes: int, rng: np.random.Generator
):
    pools = _class_pools(labels, num_classes, rng)
    draw = _capped_draw if spec.cap else _independent_draw
    counts = _dirichlet_counts(
        [len(p) for p in pools], spec.clients, spec.alpha, spec.min_samples, rng, draw
    )
    return _deal(pools, counts)


def _client_dirichlet(
    spec: ClientDirichletPartition,
    labels: np.ndarray,
    num_classes: int,
    rng: np.random.Generator,
):
    """Client k, in turn, draws q_k ~ Dir_C(alpha * v) and N // K samples of labels ~ q_k
    without replacement; a class that runs out is dropped and q_k renormalized (FedBR's code).
    The N mod K samples left over belong to no client."""
    pools = _class_pools(labels, num_classes, rng)
    left = np.array([len(pool) for pool in pools], dtype=np.int64)
    per_client = len(labels) // spec.clients
    counts = np.zeros((spec.clients, num_classes), dtype=np.int64)
    for client in range(spec.clients):
        shares = _client_shares(spec, left, rng)
        counts[client] = _draw_from_remaining(per_client, shares, left, rng)
        left -= counts[client]
    return _deal(pools, np.vstack([counts, left]))[:-1]


def _client_shares(
    spec: ClientDirichletPartition, left: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """q_k ~ Dir_C(alpha * v); with by_share, v = the classes' shares of the samples left, an
    exhausted class (share 0, the limit of a vanishing concentration) getting q = 0."""
    if spec.concentration == "uniform":
        return rng.dirichlet(np.full(len(left), spec.alpha))
    shares = np.zeros(len(left))
    held = left > 0
    shares[held] = rng.dirichlet(spec.alpha * left[held] / left.sum())
    return shares


def _quantity(
    spec: QuantityPartition, labels: np.ndarray, num_classes: int, rng: np.random.Generator
):
    """Sizes ~ Dir_K(alpha); each client's samples are a uniformly random (iid-label) subset."""
    pool = rng.permutation(len(labels))
    counts = _dirichlet_counts([len(pool)], spec.clients, spec.alpha, spec.min_samples, rng)
    return _deal([pool], counts)


def _classes(
    spec: ClassesPartition, labels: np.ndarray, num_classes: int, rng: np.random.Generator
):
    """Client k owns order[(k*C + j) % num_classes], j < C; a class splits evenly among owners."""
    per_client, clients = spec.classes_per_client, spec.clients
    if per_client > num_classes:
        raise InputError(
            f"partition.classes_per_client={per_client} exceeds the dataset's {num_classes} "
            "classes; lower it"
        )
    if clients * per_client < num_classes:
        raise InputError(
            f"partition: clients x classes_per_client = {clients * per_client} leaves some of "
            f"the {num_classes} classes without an owner; raise clients or classes_per_client"
        )
    order = rng.permutation(num_classes) if spec.shuffle_classes else np.arange(num_classes)
    owners: list[list[int]] = [[] for _ in range(num_classes)]
    for client in range(clients):
        for slot in range(per_client):
            owners[order[(client * per_client + slot) % num_classes]].append(client)
    shares: list[list[np.ndarray]] = [[] for _ in range(clients)]
    for pool, class_owners in zip(_class_pools(labels, num_classes, rng), owners, strict=True):
        for client, part in zip(class_owners, np.array_split(pool, len(class_owners)), strict=True):
            shares[client].append(part)
    return [np.concatenate(parts) for parts in shares]


def _natural(count: int, clients: np.ndarray | None, group: int | None) -> list[np.ndarray]:
    if clients is None:
        raise ValueError("a natural partition needs the data's client ids")
    ids = grouped(clients, group)
    return [np.flatnonzero(ids == client) for client in range(count)]


def _subset(spec: SubsetPartition, labels: np.ndarray, num_classes: int, rng: np.random.Generator):
    """Client k's dominant class is k % num_classes.

    Every client gets `minor_samples` random samples of each class other than its dominant
    one; the rest of a class splits evenly among the clients it dominates. When there are
    fewer clients than classes, the classes nobody dominates contribute only their minor
    samples: the remainder of those classes is left unused.
    """
    clients, minor = spec.clients, spec.minor_samples
    dominant = np.arange(clients) % num_classes
    shares: list[list[np.ndarray]] = [[] for _ in range(clients)]
    for label, pool in enumerate(_class_pools(labels, num_classes, rng)):
        minor_clients = np.flatnonzero(dominant != label)
        needed = minor * len(minor_clients)
        if needed > len(pool):
            raise InputError(
                f"partition.minor_samples={minor}: {len(minor_clients)} clients need {needed} "
                f"samples of class {label}, which has {len(pool)}; lower minor_samples"
            )
        for client, part in zip(
            minor_clients, pool[:needed].reshape(len(minor_clients), minor), strict=True
        ):
            shares[client].append(part)
        major_clients = np.flatnonzero(dominant == label)
        if len(major_clients):
            rest = np.array_split(pool[needed:], len(major_clients))
            for client, part in zip(major_clients, rest, strict=True):
                shares[client].append(part)
    return [np.concatenate(parts) for parts in shares]


_SCHEMES: dict[str, Callable[..., list[np.ndarray]]] = {
    "iid": _iid,
    "rotation": _iid,
    "dirichlet": _dirichlet,
    "quantity": _quantity,
    "classes": _classes,
    "subset": _subset,
    "client_dirichlet": _client_dirichlet,
}


# --- helpers ------------------------------------------------------------------------------


def _class_pools(
    labels: np.ndarray, num_classes: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Each class's sample indices in a random order."""
    return [rng.permutation(np.flatnonzero(labels == label)) for label in range(num_classes)]


Draw = Callable[[list[int], int, float, np.random.Generator], np.ndarray]


def _independent_draw(
    pool_sizes: list[int], clients: int, alpha: float, rng: np.random.Generator
) -> np.ndarray:
    """clients x pools counts: pool p is dealt by a multinomial over q_p ~ Dir_K(alpha)."""
    return np.stack(
        [rng.multinomial(size, rng.dirichlet(np.full(clients, alpha))) for size in pool_sizes],
        axis=1,
    )


def _capped_draw(
    pool_sizes: list[int], clients: int, alpha: float, rng: np.random.Generator
) -> np.ndarray:
    """Like `_independent_draw`, but pools are dealt in turn and clients already holding
    N / K samples get no share of the next pool (q_p renormalized over the others)."""
    cap = sum(pool_sizes) / clients
    counts = np.zeros((clients, len(pool_sizes)), dtype=np.int64)
    held = np.zeros(clients, dtype=np.int64)
    for p, size in enumerate(pool_sizes):
        counts[:, p] = rng.multinomial(
            size, _restricted(rng.dirichlet(np.full(clients, alpha)), held < cap)
        )
        held += counts[:, p]
    return counts


def _restricted(shares: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """`shares` zeroed outside `allowed` and renormalized; uniform over `allowed` when they
    carry no mass there (a tiny alpha can put all of it elsewhere); `shares` as they are when
    no client is allowed (every client at the cap: only an empty pool is left to deal)."""
    if not allowed.any():
        return shares
    kept = np.where(allowed, shares, 0.0)
    if kept.sum() <= 0:
        kept = allowed.astype(np.float64)
    return kept / kept.sum()


def _draw_from_remaining(
    count: int, shares: np.ndarray, left: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Per-pool counts of `count` draws from `shares` without exceeding `left`: draws that land
    on a full pool are redrawn over the pools with room. Ends within len(left) + 1 passes,
    since each pass either finishes or fills a pool; needs count <= left.sum()."""
    taken = np.zeros_like(left)
    while count > 0:
        room = left - taken
        drawn = np.minimum(rng.multinomial(count, _restricted(shares, room > 0)), room)
        taken += drawn
        count -= int(drawn.sum())
    return taken


def _dirichlet_counts(
    pool_sizes: list[int],
    clients: int,
    alpha: float,
    min_samples: int,
    rng: np.random.Generator,
    draw: Draw = _independent_draw,
) -> np.ndarray:
    """clients x pools counts from `draw`.

    Up to MAX_DIRICHLET_DRAWS draws are tried for one meeting min_samples; the draw with the
    smallest shortfall is then repaired deterministically.
    """
    total = sum(pool_sizes)
    if min_samples * clients > total:
        raise InputError(
            f"partition.min_samples={min_samples} x clients={clients} exceeds the {total} "
            "training samples; lower min_samples or clients"
        )
    best, best_shortfall = None, None
    for _ in range(MAX_DIRICHLET_DRAWS):
        counts = draw(pool_sizes, clients, alpha, rng)
        shortfall = int(np.maximum(min_samples - counts.sum(axis=1), 0).sum())
        if best_shortfall is None or shortfall < best_shortfall:
            best, best_shortfall = counts, shortfall
        if shortfall == 0:
            break
    return _top_up(best, min_samples)


def _top_up(counts: np.ndarray, min_samples: int) -> np.ndarray:
    """Move samples from the largest clients (their largest pool) to clients below min_samples.

    Terminates: while some client is short, the total (>= clients * min_samples) forces the
    largest client above min_samples, so every step moves at least one sample.
    """
    counts = counts.copy()
    sizes = counts.sum(axis=1)
    for client in np.flatnonzero(sizes < min_samples):
        while sizes[client] < min_samples:
            donor = int(np.argmax(sizes))
            pool = int(np.argmax(counts[donor]))
            moved = min(
                min_samples - sizes[client], sizes[donor] - min_samples, counts[donor, pool]
            )
            counts[donor, pool] -= moved
            counts[client, pool] += moved
            sizes[donor] -= moved
            sizes[client] += moved
    return counts


def _deal(pools: list[np.ndarray], counts: np.ndarray) -> list[np.ndarray]:
    """Client k takes the next counts[k, p] indices of each pool p, in client order."""
    pieces = [np.split(pool, np.cumsum(counts[:, p])[:-1]) for p, pool in enumerate(pools)]
    return [np.concatenate([piece[k] for piece in pieces]) for k in range(counts.shape[0])]


def _angles(spec: PartitionConfig) -> np.ndarray | None:
    rotation = spec.rotation
    if rotation is None:
        return None
    if rotation.angles is None:
        return np.arange(spec.clients) * float(rotation.step)
    if len(rotation.angles) != spec.clients:
        raise InputError(
            f"partition.rotation.angles has {len(rotation.angles)} entries for {spec.clients} "
            "clients; give one angle per client"
        )
    return np.asarray(rotation.angles, dtype=np.float64)
