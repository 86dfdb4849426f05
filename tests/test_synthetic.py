"""FedProx's Synthetic(alpha, beta) (fedhet.data.synthetic): the generator's statistics are the
paper's (Li et al. 2020, Sec. 5.1), all its randomness comes from the spec's seed, and its
natural partition is its clients."""

from __future__ import annotations

import numpy as np
import pytest

from fedhet.core.errors import InputError
from fedhet.core.spec import parse_spec
from fedhet.data.partition_plan import partition_node
from fedhet.data.partition_stage import spec_partition
from fedhet.data.synthetic import SyntheticData, generate


def label_skew(data) -> float:
    """Mean total-variation distance of the clients' label laws from the pooled one."""
    clients = range(data.train_client.max() + 1)
    counts = np.stack(
        [np.bincount(data.train_y[data.train_client == k], minlength=10) for k in clients]
    )
    counts = counts.astype(float)
    shares = counts / counts.sum(axis=1, keepdims=True)
    return float(0.5 * np.abs(shares - counts.sum(axis=0) / counts.sum()).sum(axis=1).mean())


def client_means(data) -> np.ndarray:
    clients = range(data.train_client.max() + 1)
    return np.stack([data.train_x[data.train_client == k].mean(axis=0) for k in clients])


def test_inputs_follow_the_papers_law():
    """x ~ N(v_k, Sigma) with Sigma_jj = j^-1.2, and v_k ~ N(B_k, 1), B_k ~ N(0, beta): the
    clients' means spread with variance 1 + beta^2."""
    data = generate(SyntheticData(alpha=1, beta=1, clients=300), seed=0)
    assert data.train_x.shape[1] == 60 and set(np.unique(data.train_y)) == set(range(10))
    means = client_means(data)
    within = (data.train_x - means[data.train_client]).var(axis=0)
    np.testing.assert_allclose(within / np.arange(1, 61) ** -1.2, 1, rtol=0.05)
    assert means.var() == pytest.approx(1 + 1**2, rel=0.2)
    iid = client_means(generate(SyntheticData(iid=True, clients=300), seed=0))
    assert np.abs(iid).max() < 0.5 and iid.var() < 0.01  # v = 0 for every client


def test_clients_sizes_follow_the_power_law_and_a_tenth_tests():
    data = generate(SyntheticData(clients=300), seed=1)
    kept = np.bincount(data.train_client)  # floor(0.9 n_k), n_k = floor(LogNormal(4, 2)) + 50
    assert kept.min() >= 45
    drawn = np.log(np.maximum(kept / 0.9 - 50, 1))
    assert np.median(drawn) == pytest.approx(4, abs=0.45)
    assert np.percentile(drawn, 84) - np.median(drawn) == pytest.approx(2, abs=0.5)
    assert 0.09 < len(data.test_y) / (len(data.test_y) + len(data.train_y)) < 0.115


def test_labels_are_skewed_per_client_unless_iid():
    """Every client labels with its own W_k, b_k; the IID variant shares one."""
    configs = [{"iid": True}, {"alpha": 0, "beta": 0}, {"alpha": 1, "beta": 1}]
    iid, zero, one = (label_skew(generate(SyntheticData(**c), seed=2)) for c in configs)
    assert iid < 0.2 and zero > 0.6 and one > 0.6


def test_alpha_shifts_every_logit_equally_so_labels_do_not_depend_on_it():
    """W_k ~ N(u_k, 1) and b_k ~ N(u_k, 1) add u_k (sum(x) + 1) to every class's logit: the
    argmax, hence the data, is that of alpha = 0 for the same draws (the paper's generator;
    its heterogeneity in labels comes from the clients' own W_k, in inputs from beta)."""
    zero, one = (generate(SyntheticData(alpha=a, beta=0.5), seed=3) for a in (0, 1))
    assert np.array_equal(zero.train_x, one.train_x)
    assert np.mean(zero.train_y == one.train_y) > 0.999


def test_the_spec_seed_is_the_only_randomness():
    config = SyntheticData(alpha=0.5, beta=0.5)
    first, again, other = generate(config, 4), generate(config, 4), generate(config, 5)
    assert np.array_equal(first.train_x, again.train_x)
    assert np.array_equal(first.train_y, again.train_y)
    assert first.train_x.shape != other.train_x.shape or not np.array_equal(
        first.train_x, other.train_x
    )


def test_its_natural_partition_is_its_clients_and_its_key_its_parameters():
    spec = {
        "data": {"dataset": "synthetic", "alpha": 1, "beta": 1},
        "partition": {"scheme": "natural"},
        "model": {"arch": "mlp", "hidden": []},
    }
    parsed = parse_spec(spec)
    assert parsed.partition.clients == 30
    part = spec_partition(parsed)
    clients = generate(parsed.data, parsed.seed).train_client
    assert [len(k) for k in part.client_indices] == list(np.bincount(clients, minlength=30))
    key = partition_node(parsed).key
    assert partition_node(parse_spec(spec)).key == key
    for change in ({"alpha": 0.5}, {"beta": 0.5}, {"clients": 20}):
        data = {**spec["data"], **change}
        assert partition_node(parse_spec({**spec, "data": data})).key != key


def test_the_iid_variant_has_no_alpha_or_beta():
    with pytest.raises(InputError, match="data: the IID variant has no alpha or beta"):
        parse_spec({"data": {"dataset": "synthetic", "iid": True, "beta": 1}})
