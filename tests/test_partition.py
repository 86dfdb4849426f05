import hashlib
import time

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fedhet.core.errors import InputError
from fedhet.core.spec import (
    ClassesPartition,
    ClientDirichletPartition,
    DirichletPartition,
    IIDPartition,
    QuantityPartition,
    RotationPartition,
    RotationSpec,
    SubsetPartition,
)
from fedhet.data.partition import _client_dirichlet, _top_up, make_partition, summary_rows

FAST = settings(max_examples=40, deadline=None)


@st.composite
def label_arrays(draw, min_size=1, max_size=300):
    num_classes = draw(st.integers(2, 8))
    size = draw(st.integers(min_size, max_size))
    labels = draw(st.lists(st.integers(0, num_classes - 1), min_size=size, max_size=size))
    return np.array(labels, dtype=np.int64), num_classes


@st.composite
def covering_specs(draw, labels_size):
    """A spec of every scheme that must assign each sample to exactly one client."""
    clients = draw(st.integers(1, 12))
    scheme = draw(st.sampled_from(["iid", "dirichlet", "classes", "quantity", "rotation"]))
    alpha = draw(st.sampled_from([0.001, 0.1, 1.0, 100.0]))
    min_samples = draw(st.integers(0, labels_size // clients))
    if scheme == "iid":
        return IIDPartition(clients=clients)
    if scheme == "dirichlet":
        cap = draw(st.booleans())
        return DirichletPartition(clients=clients, alpha=alpha, min_samples=min_samples, cap=cap)
    if scheme == "quantity":
        return QuantityPartition(clients=clients, alpha=alpha, min_samples=min_samples)
    if scheme == "rotation":
        return RotationPartition(clients=clients)
    return ClassesPartition(
        clients=clients,
        classes_per_client=draw(st.integers(1, 8)),
        shuffle_classes=draw(st.booleans()),
    )


def assert_consistent(partition, labels, num_classes):
    for indices, counts in zip(partition.client_indices, partition.histogram, strict=True):
        assert indices.dtype == np.int64
        assert np.all(np.diff(indices) > 0), "indices sorted, no duplicates within a client"
        np.testing.assert_array_equal(np.bincount(labels[indices], minlength=num_classes), counts)
    assert partition.histogram.dtype == np.int64


def assert_exact_cover(partition, size):
    everything = np.concatenate(partition.client_indices)
    np.testing.assert_array_equal(np.sort(everything), np.arange(size))


@FAST
@given(data=st.data(), labelled=label_arrays(), seed=st.integers(0, 2**32 - 1))
def test_schemes_assign_every_sample_to_exactly_one_client(data, labelled, seed):
    labels, num_classes = labelled
    spec = data.draw(covering_specs(len(labels)))
    needs_owner = spec.scheme == "classes" and (
        spec.classes_per_client > num_classes
        or spec.clients * spec.classes_per_client < num_classes
    )
    if needs_owner:
        with pytest.raises(InputError):
            make_partition(spec, labels, num_classes, seed)
        return
    partition = make_partition(spec, labels, num_classes, seed)
    assert partition.num_clients == spec.clients
    assert_consistent(partition, labels, num_classes)
    assert_exact_cover(partition, len(labels))
    if hasattr(spec, "min_samples"):
        assert min(map(len, partition.client_indices)) >= spec.min_samples


@FAST
@given(
    labelled=label_arrays(),
    clients=st.integers(1, 12),
    minor=st.integers(0, 6),
    seed=st.integers(0, 99),
)
def test_subset_uses_exactly_the_documented_samples(labelled, clients, minor, seed):
    labels, num_classes = labelled
    spec = SubsetPartition(clients=clients, minor_samples=minor)
    class_sizes = np.bincount(labels, minlength=num_classes)
    dominant = np.arange(clients) % num_classes
    minor_clients = np.array([np.sum(dominant != c) for c in range(num_classes)])
    if np.any(minor * minor_clients > class_sizes):
        with pytest.raises(InputError):
            make_partition(spec, labels, num_classes, seed)
        return
    partition = make_partition(spec, labels, num_classes, seed)
    assert_consistent(partition, labels, num_classes)
    everything = np.concatenate(partition.client_indices)
    assert len(np.unique(everything)) == len(everything), "no sample given twice"
    for client, counts in enumerate(partition.histogram):
        others = np.arange(num_classes) != dominant[client]
        assert np.all(counts[others] == minor)
    for label in range(num_classes):
        used = partition.histogram[:, label].sum()
        owned = label in dominant
        assert used == (class_sizes[label] if owned else minor * clients)
        owners = partition.histogram[dominant == label, label]
        if owned:
            assert owners.max() - owners.min() <= 1, "dominant class split evenly"


def balanced_labels(num_classes=10, per_class=6000):
    return np.repeat(np.arange(num_classes), per_class)


def test_one_class_per_client():
    labels = balanced_labels(per_class=50)
    for seed in range(5):
        spec = ClassesPartition(clients=20, classes_per_client=1)
        partition = make_partition(spec, labels, 10, seed)
        assert np.all(np.count_nonzero(partition.histogram, axis=1) == 1)
        owned = partition.histogram.argmax(axis=1)
        assert np.all(np.bincount(owned, minlength=10) == 2), "each class has two owners"
        assert np.all(partition.histogram.max(axis=1) == 25), "a class splits evenly"


@FAST
@given(
    clients=st.integers(1, 15),
    per_client=st.integers(1, 10),
    shuffle=st.booleans(),
    seed=st.integers(0, 99),
)
def test_classes_gives_each_client_its_cyclic_classes(clients, per_client, shuffle, seed):
    assume(clients * per_client >= 10)
    labels = balanced_labels(per_class=40)
    spec = ClassesPartition(clients=clients, classes_per_client=per_client, shuffle_classes=shuffle)
    histogram = make_partition(spec, labels, 10, seed).histogram
    owners_per_class = np.count_nonzero(histogram, axis=0)
    assert np.all(np.count_nonzero(histogram, axis=1) == per_client)
    for label in range(10):
        counts = histogram[histogram[:, label] > 0, label]
        assert counts.max() - counts.min() <= 1
        assert counts.sum() == 40
    # cyclic slots: class ownership counts differ by at most one across classes
    assert owners_per_class.max() - owners_per_class.min() <= 1


def test_unshuffled_classes_are_label_sorted_blocks():
    spec = ClassesPartition(clients=5, classes_per_client=2, shuffle_classes=False)
    partition = make_partition(spec, balanced_labels(per_class=30), 10, seed=3)
    for client, counts in enumerate(partition.histogram):
        assert set(np.flatnonzero(counts)) == {2 * client, 2 * client + 1}


def test_classes_rejects_impossible_settings():
    labels = balanced_labels(per_class=5)
    with pytest.raises(InputError, match="classes_per_client"):
        make_partition(ClassesPartition(clients=4, classes_per_client=11), labels, 10, 0)
    with pytest.raises(InputError, match="without an owner"):
        make_partition(ClassesPartition(clients=4, classes_per_client=2), labels, 10, 0)


def max_class_share_gap(partition, num_classes):
    shares = partition.histogram / partition.histogram.sum(axis=1, keepdims=True)
    return np.abs(shares.max(axis=1) - 1 / num_classes).max()


def test_large_alpha_is_close_to_iid_and_small_alpha_is_not():
    # 10 clients x 6,000 samples: with alpha=1e3 every client's largest class share lies
    # within 0.02 of 1/10 (q_c[k] has sd ~0.003); alpha=0.1 is far from that.
    labels = balanced_labels()
    for seed in range(3):
        near = make_partition(DirichletPartition(clients=10, alpha=1e3), labels, 10, seed)
        far = make_partition(DirichletPartition(clients=10, alpha=0.1), labels, 10, seed)
        assert max_class_share_gap(near, 10) < 0.02
        assert max_class_share_gap(far, 10) > 0.2


def test_quantity_skews_sizes_but_not_labels():
    labels = balanced_labels(per_class=1000)
    partition = make_partition(
        QuantityPartition(clients=5, alpha=0.3, min_samples=500), labels, 10, 1
    )
    sizes = partition.histogram.sum(axis=1)
    assert sizes.min() >= 500 and sizes.max() > 2 * sizes.min()
    assert max_class_share_gap(partition, 10) < 0.05


ALL_SPECS = [
    IIDPartition(clients=7),
    DirichletPartition(clients=7, alpha=0.3, min_samples=5),
    ClassesPartition(clients=7, classes_per_client=3),
    SubsetPartition(clients=7, minor_samples=2),
    QuantityPartition(clients=7, alpha=0.5),
    RotationPartition(clients=7),
    ClientDirichletPartition(clients=7, alpha=0.3),
]


@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: s.scheme)
def test_seed_determines_the_partition(spec):
    labels = np.random.default_rng(0).integers(0, 10, size=2000)
    first, again = (make_partition(spec, labels, 10, seed=11) for _ in range(2))
    other = make_partition(spec, labels, 10, seed=12)
    for a, b in zip(first.client_indices, again.client_indices, strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(first.client_indices, other.client_indices, strict=True)
    )


@FAST
@given(
    clients=st.integers(1, 60),
    alpha=st.sampled_from([1e-3, 1e-2, 0.1, 1.0]),
    fill=st.floats(0, 1),
    seed=st.integers(0, 2**32 - 1),
)
def test_min_samples_is_honoured(clients, alpha, fill, seed):
    labels = np.random.default_rng(seed).integers(0, 5, size=300)
    min_samples = int(fill * 300 // clients)
    for spec in (
        DirichletPartition(clients=clients, alpha=alpha, min_samples=min_samples),
        DirichletPartition(clients=clients, alpha=alpha, min_samples=min_samples, cap=True),
        QuantityPartition(clients=clients, alpha=alpha, min_samples=min_samples),
    ):
        partition = make_partition(spec, labels, 5, seed)
        assert partition.histogram.sum(axis=1).min() >= min_samples
        assert partition.histogram.sum() == 300


def test_min_samples_beyond_the_data_is_an_input_error():
    labels = np.zeros(100, dtype=np.int64)
    with pytest.raises(InputError, match="min_samples"):
        make_partition(DirichletPartition(clients=10, min_samples=11), labels, 2, 0)
    with pytest.raises(InputError, match="min_samples"):
        make_partition(QuantityPartition(clients=101, min_samples=1), labels, 2, 0)


@pytest.mark.parametrize(
    "spec",
    [
        DirichletPartition(clients=1000, alpha=0.001, min_samples=20),
        DirichletPartition(clients=1000, alpha=0.001, min_samples=10, cap=True),
        ClientDirichletPartition(clients=1000, alpha=0.001),
    ],
    ids=["dirichlet", "dirichlet-cap", "client_dirichlet"],
)
def test_tiny_alpha_with_many_clients_finishes_fast(spec):
    labels = np.random.default_rng(0).permutation(balanced_labels())
    start = time.process_time()  # CPU seconds: a loaded machine stretches wall time, not these
    partition = make_partition(spec, labels, 10, seed=0)
    elapsed = time.process_time() - start
    assert elapsed < 2.0
    assert partition.histogram.sum(axis=1).min() >= getattr(spec, "min_samples", 60)
    assert partition.histogram.sum() == 60_000


# sha256 prefixes of partitions made by the code before `cap` and `client_dirichlet` existed:
# the default dirichlet (and quantity, which shares its draws) must stay bit-identical.
UNCHANGED_PARTITIONS = [
    (DirichletPartition(clients=10, alpha=0.1), "1a2f0a61f2509db2"),
    (DirichletPartition(clients=50, alpha=0.05, min_samples=10), "7141b705b26f224b"),
    (QuantityPartition(clients=8, alpha=0.5), "38004321488cd723"),
]


@pytest.mark.parametrize(("spec", "digest"), UNCHANGED_PARTITIONS)
def test_default_dirichlet_partitions_are_unchanged(spec, digest):
    labels = np.random.default_rng(5).integers(0, 10, 3000)
    partition = make_partition(spec, labels, 10, 7)
    h = hashlib.sha256()
    for indices in partition.client_indices:
        h.update(indices.tobytes())
        h.update(b"|")
    assert h.hexdigest()[:16] == digest


@FAST
@given(
    clients=st.integers(1, 40),
    alpha=st.sampled_from([1e-3, 0.1, 1.0, 100.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_capped_dirichlet_gives_no_class_to_a_client_already_full(clients, alpha, seed):
    labels = np.random.default_rng(seed).integers(0, 6, size=400)
    spec = DirichletPartition(clients=clients, alpha=alpha, cap=True)
    histogram = make_partition(spec, labels, 6, seed).histogram
    held_before = np.cumsum(histogram, axis=1) - histogram  # classes are dealt in label order
    assert np.all(held_before[histogram > 0] < 400 / clients)
    assert histogram.sum() == 400


@FAST
@given(
    labelled=label_arrays(min_size=1, max_size=400),
    clients=st.integers(1, 50),
    alpha=st.sampled_from([1e-3, 0.1, 1.0, 100.0]),
    concentration=st.sampled_from(["uniform", "by_share"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_client_dirichlet_gives_every_client_n_over_k_distinct_samples(
    labelled, clients, alpha, concentration, seed
):
    labels, num_classes = labelled
    spec = ClientDirichletPartition(clients=clients, alpha=alpha, concentration=concentration)
    partition = make_partition(spec, labels, num_classes, seed)
    assert_consistent(partition, labels, num_classes)
    assert [len(i) for i in partition.client_indices] == [len(labels) // clients] * clients
    everything = np.concatenate(partition.client_indices)
    assert len(np.unique(everything)) == len(everything), "no sample held twice"


def test_client_dirichlet_is_label_skewed_and_drops_exhausted_classes():
    labels = np.random.default_rng(0).permutation(balanced_labels())
    spec = ClientDirichletPartition(clients=100, alpha=0.1)
    histogram = make_partition(spec, labels, 10, seed=3).histogram
    shares = histogram.max(axis=1) / histogram.sum(axis=1)
    assert np.median(shares) > 0.7  # mostly one or two classes per client
    # every sample is used (N/K divides N), so the clients that came last had to take the
    # classes the others left, whatever their own q_k: the class totals are exact
    np.testing.assert_array_equal(histogram.sum(axis=0), np.full(10, 6000))


class RecordingRng:
    """A numpy Generator that records the concentration vector of every Dirichlet draw."""

    def __init__(self, seed: int):
        self.rng, self.concentrations = np.random.default_rng(seed), []

    def dirichlet(self, alpha):
        self.concentrations.append(np.asarray(alpha, dtype=np.float64).copy())
        return self.rng.dirichlet(alpha)

    def __getattr__(self, name):
        return getattr(self.rng, name)


@pytest.mark.parametrize("seed", range(4))
def test_client_dirichlet_by_share_concentrates_on_the_classes_left(seed):
    """FedBR's code: client k's q_k ~ Dir(0.1 * p), p = each class's share of the samples no
    earlier client took; an exhausted class gets no mass."""
    labels = np.array([0] * 6 + [1] * 3 + [2] * 3)
    spec = ClientDirichletPartition(clients=3, alpha=0.1, concentration="by_share")
    rng = RecordingRng(seed)
    clients = _client_dirichlet(spec, labels, 3, rng)
    left = np.array([6.0, 3.0, 3.0])
    for k, concentration in enumerate(rng.concentrations):
        np.testing.assert_allclose(concentration, 0.1 * left[left > 0] / left.sum())
        left -= np.bincount(labels[clients[k]], minlength=3)
    assert len(rng.concentrations) == 3
    np.testing.assert_allclose(rng.concentrations[0], [0.05, 0.025, 0.025])
    uniform = RecordingRng(seed)
    _client_dirichlet(spec.model_copy(update={"concentration": "uniform"}), labels, 3, uniform)
    np.testing.assert_array_equal(uniform.concentrations, np.full((3, 3), 0.1))


@FAST
@given(
    counts=st.lists(st.lists(st.integers(0, 30), min_size=3, max_size=3), min_size=1, max_size=30),
    fill=st.floats(0, 1),
)
def test_top_up_meets_the_minimum_and_only_takes_surplus(counts, fill):
    counts = np.array(counts, dtype=np.int64)
    min_samples = int(fill * counts.sum() // len(counts))
    repaired = _top_up(counts, min_samples)
    np.testing.assert_array_equal(repaired.sum(axis=0), counts.sum(axis=0))
    assert np.all(repaired >= 0)
    sizes, new_sizes = counts.sum(axis=1), repaired.sum(axis=1)
    assert np.all(new_sizes >= min_samples)
    short = sizes < min_samples
    np.testing.assert_array_equal(new_sizes[short], min_samples)
    assert np.all(new_sizes[~short] <= sizes[~short]), "donors only give"
    assert np.all(new_sizes[~short] >= min_samples), "donors keep the minimum"


def test_rotation_angles():
    labels = balanced_labels(per_class=10)
    by_step = make_partition(
        RotationPartition(clients=4, rotation=RotationSpec(step=30)), labels, 10, 0
    )
    np.testing.assert_array_equal(by_step.angles, [0, 30, 60, 90])
    given_angles = RotationSpec(angles=[5, -5, 45])
    spec = DirichletPartition(clients=3, alpha=1.0, rotation=given_angles)
    np.testing.assert_array_equal(make_partition(spec, labels, 10, 0).angles, [5, -5, 45])
    assert make_partition(IIDPartition(clients=3), labels, 10, 0).angles is None
    with pytest.raises(InputError, match="one angle per client"):
        make_partition(IIDPartition(clients=2, rotation=given_angles), labels, 10, 0)


def test_summary_rows_describe_each_client():
    labels = balanced_labels(per_class=20)
    spec = SubsetPartition(clients=3, minor_samples=2, rotation=RotationSpec(step=10))
    rows = summary_rows(make_partition(spec, labels, 10, 0))
    assert [r["client"] for r in rows] == [0, 1, 2]
    for client, row in enumerate(rows):
        dominant = 20 - 2 * 2  # the two other clients take their minor samples first
        assert row["size"] == dominant + 9 * 2
        assert row["classes"] == 10
        assert row["dominant_class"] == client
        assert row["dominant_share"] == pytest.approx(dominant / (dominant + 18))
        assert row["angle"] == 10.0 * client


@FAST
@given(
    data=st.data(),
    labelled=label_arrays(),
    limit=st.integers(1, 60),
    seed=st.integers(0, 2**32 - 1),
)
def test_max_samples_keeps_a_random_subset_of_each_clients_share(data, labelled, limit, seed):
    labels, num_classes = labelled
    spec = data.draw(covering_specs(len(labels)))
    assume(spec.scheme != "classes" or spec.classes_per_client <= num_classes)
    assume(spec.scheme != "classes" or spec.clients * spec.classes_per_client >= num_classes)
    full = make_partition(spec, labels, num_classes, seed)
    capped = make_partition(
        spec.model_copy(update={"max_samples": limit}), labels, num_classes, seed
    )
    for whole, kept in zip(full.client_indices, capped.client_indices, strict=True):
        assert len(kept) == min(len(whole), limit)
        assert len(np.unique(kept)) == len(kept)
        assert np.isin(kept, whole).all()
        if len(whole) <= limit:
            np.testing.assert_array_equal(kept, whole)


def test_capped_dirichlet_deals_an_empty_pool_after_every_client_reached_its_cap():
    """Found by the property above: one client holds all N samples (the cap) before the last
    pool, which is empty; renormalizing over no allowed client divided 0 by 0."""
    spec = DirichletPartition(clients=1, alpha=0.001, cap=True)
    part = make_partition(spec, np.array([0]), 2, 0)
    assert [list(indices) for indices in part.client_indices] == [[0]]


def test_max_samples_draws_from_the_whole_share_and_keeps_keys():
    labels = np.repeat(np.arange(10), 600)
    spec = ClassesPartition(clients=10, classes_per_client=1)
    capped = make_partition(spec.model_copy(update={"max_samples": 60}), labels, 10, 3)
    kept = np.concatenate(capped.client_indices)
    assert len(kept) == 600
    # drawn at random, not the first 60 of each class: the indices spread over each class block
    assert (kept % 600 >= 300).mean() == pytest.approx(0.5, abs=0.1)
    assert "max_samples" not in spec.model_dump(mode="json")
