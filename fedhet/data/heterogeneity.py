"""How heterogeneous a partition is, and whether it is a partition at all.

Measures, from the clients x classes label histogram (so they apply to every stored partition,
old ones too):
- each client's label distribution p_k against the pooled one q (all clients' samples together):
  Hellinger distance sqrt(1 - sum_c sqrt(p_c q_c)) in [0, 1]; Jensen-Shannon divergence
  (base 2, in [0, 1]); and the earth mover's distance of Zhao et al. (2018, "Federated Learning
  with Non-IID Data"), sum_c |p_c - q_c| in [0, 2] (classes have no order, so every pair of
  labels is one unit apart and the transport cost is the L1 distance);
- classes held: how many classes a client has any sample of;
- quantity skew: the clients' sizes' coefficient of variation (population std / mean) and Gini
  coefficient (0: equal sizes; near 1: one client holds everything).
An iid split still differs from q by sampling alone: `iid_reference` is the mean Hellinger
distance that an iid split of the same sizes reaches, from seeded multinomial draws.

Checks (`check_partition`): no sample in two clients (or in a client and the validation or
server share), every index inside the training set, and no sample left out unless the scheme
says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedhet.core.errors import RunError

IID_DRAWS = 200  # multinomial draws behind the iid reference


def distributions(histogram: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(clients x classes label distributions, the pooled distribution); an empty client's row
    is the pooled distribution (it differs by nothing)."""
    counts = np.asarray(histogram, dtype=np.float64)
    pooled = counts.sum(0) / max(counts.sum(), 1.0)
    sizes = counts.sum(1, keepdims=True)
    rows = np.where(sizes > 0, counts / np.maximum(sizes, 1.0), pooled)
    return rows, pooled


def hellinger(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Hellinger distance of each row of `p` to `q`, in [0, 1]."""
    affinity = np.sqrt(p * q).sum(-1)
    return np.sqrt(np.clip(1.0 - affinity, 0.0, None))


def jensen_shannon(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Jensen-Shannon divergence (base 2) of each row of `p` to `q`, in [0, 1]."""
    from scipy.spatial.distance import jensenshannon  # 0.3 s of imports a partition never needs

    return np.array([jensenshannon(row, q, base=2) ** 2 for row in p])


def earth_movers(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Earth mover's distance over unordered classes (every two labels one unit apart)."""
    return np.abs(p - q).sum(-1)


def gini(sizes: np.ndarray) -> float:
    """Gini coefficient of the clients' sizes (0: all equal)."""
    values = np.sort(np.asarray(sizes, dtype=np.float64))
    if values.sum() == 0:
        return 0.0
    ranks = np.arange(1, len(values) + 1)
    return float((2 * ranks - len(values) - 1) @ values / (len(values) * values.sum()))


def coefficient_of_variation(sizes: np.ndarray) -> float:
    values = np.asarray(sizes, dtype=np.float64)
    return float(values.std() / values.mean()) if values.mean() > 0 else 0.0


def iid_reference(histogram: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """(mean, largest) over seeded multinomial draws of an iid split with the same client sizes
    of its mean Hellinger distance to the pooled distribution: the sampling noise every split
    has, and how far it goes."""
    sizes = np.asarray(histogram).sum(1)
    _, pooled = distributions(histogram)
    held = sizes[sizes > 0]
    if len(held) == 0:
        return 0.0, 0.0
    rng = np.random.default_rng(seed)
    draws = rng.multinomial(np.tile(held, IID_DRAWS), pooled).astype(np.float64)
    rows = draws / np.tile(held, IID_DRAWS)[:, None]
    per_split = hellinger(rows, pooled).reshape(IID_DRAWS, len(held)).mean(1)
    return float(per_split.mean()), float(per_split.max())


def mean_hellinger(histogram: np.ndarray) -> float:
    """The clients' mean Hellinger distance to the pooled label distribution, over those that
    hold samples (0 where none does)."""
    p, q = distributions(histogram)
    held = np.asarray(histogram).sum(1) > 0
    return float(hellinger(p, q)[held].mean()) if held.any() else 0.0


def client_measures(histogram: np.ndarray) -> list[dict[str, float]]:
    """Per client: its Hellinger, Jensen-Shannon and earth mover's distance to the pooled label
    distribution."""
    p, q = distributions(histogram)
    columns = zip(hellinger(p, q), jensen_shannon(p, q), earth_movers(p, q), strict=True)
    return [
        {"hellinger": float(h), "jensen_shannon": float(js), "earth_movers": float(emd)}
        for h, js, emd in columns
    ]


@dataclass(frozen=True)
class Heterogeneity:
    """A partition's heterogeneity in numbers (means over the clients that hold samples)."""

    hellinger: float
    jensen_shannon: float
    earth_movers: float
    iid_hellinger: float  # what an iid split of the same sizes reaches
    classes_held: float
    classes: int
    size_cv: float
    size_gini: float

    def line(self) -> str:
        return (
            f"label skew: Hellinger {self.hellinger:.3f} (iid split {self.iid_hellinger:.3f}), "
            f"Jensen-Shannon {self.jensen_shannon:.3f}, earth mover's {self.earth_movers:.3f}; "
            f"{self.classes_held:.1f} of {self.classes} classes a client; "
            f"quantity skew: sizes' CV {self.size_cv:.2f}, Gini {self.size_gini:.2f}"
        )

    def caption(self) -> str:
        """The measures in a line short enough for a figure's panel."""
        return (
            f"Hellinger {self.hellinger:.3f} (iid {self.iid_hellinger:.3f}), "
            f"JS {self.jensen_shannon:.3f}, EMD {self.earth_movers:.3f}\n"
            f"{self.classes_held:.1f} of {self.classes} classes a client, "
            f"sizes' CV {self.size_cv:.2f}, Gini {self.size_gini:.2f}"
        )


def heterogeneity(histogram: np.ndarray) -> Heterogeneity:
    histogram = np.asarray(histogram)
    sizes = histogram.sum(1)
    held = sizes > 0
    rows = [m for m, h in zip(client_measures(histogram), held, strict=True) if h] or [
        {"hellinger": 0.0, "jensen_shannon": 0.0, "earth_movers": 0.0}
    ]
    return Heterogeneity(
        hellinger=mean_hellinger(histogram),
        jensen_shannon=float(np.mean([r["jensen_shannon"] for r in rows])),
        earth_movers=float(np.mean([r["earth_movers"] for r in rows])),
        iid_hellinger=iid_reference(histogram)[0],
        classes_held=float(np.count_nonzero(histogram[held], axis=1).mean()) if held.any() else 0,
        classes=histogram.shape[1],
        size_cv=coefficient_of_variation(sizes),
        size_gini=gini(sizes),
    )


def check_partition(
    shares: list[np.ndarray], train_size: int, left_out: int | None, what: str
) -> None:
    """RunError naming `what` unless `shares` (the clients' indices, then any validation and
    server shares) are disjoint, inside [0, train_size), and leave out at most `left_out`
    samples (None: any number, as the scheme allows)."""
    every = np.concatenate([np.asarray(s, dtype=np.int64) for s in shares] or [np.zeros(0, int)])
    if every.size and (every.min() < 0 or every.max() >= train_size):
        raise RunError(
            f"{what}: an index outside the {train_size} training samples; the partition is broken"
        )
    counts = np.bincount(every, minlength=train_size)
    twice = int(np.count_nonzero(counts > 1))
    if twice:
        raise RunError(f"{what}: {twice} samples are dealt to two clients; the partition is broken")
    missing = int(np.count_nonzero(counts == 0))
    if left_out is not None and missing > left_out:
        raise RunError(
            f"{what}: {missing} of {train_size} samples belong to no client, where the scheme "
            f"leaves out at most {left_out}; the partition is broken"
        )


def allowed_left_out(config, pool: int) -> int | None:
    """How many of the `pool` samples the partition `config` may leave out: FedBR's
    client_dirichlet deals N // K samples to each client (N mod K stay out), subset and
    max_samples deal fewer by design (None: any number); every other scheme deals them all."""
    if config.max_samples is not None or config.scheme == "subset":
        return None
    if config.scheme == "client_dirichlet":
        return pool % config.clients
    return 0


IID_LABEL_SCHEMES = ("iid", "rotation", "quantity")  # schemes that deal labels at random
IID_MARGIN = 1.25  # how far past the largest of the iid draws an iid scheme may go


def check_iid_labels(config, histogram: np.ndarray, what: str) -> None:
    """RunError when a scheme that deals labels at random (iid, rotation, quantity) gives more
    label skew than iid splits of the same sizes reach (e.g. label-sorted data dealt in blocks)."""
    if config.scheme not in IID_LABEL_SCHEMES or config.max_samples is not None:
        return
    measured = mean_hellinger(histogram)
    _, largest = iid_reference(histogram)
    if measured > IID_MARGIN * largest + 1e-9:
        raise RunError(
            f"{what}: scheme {config.scheme} deals labels at random, but its clients' mean "
            f"Hellinger distance to the pooled labels is {measured:.3f}, where iid splits of "
            f"the same sizes reach at most {largest:.3f}; the partition is broken"
        )
