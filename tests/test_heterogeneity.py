"""How heterogeneous a partition is (fedhet.data.heterogeneity), against closed forms, and the
checks every partition passes before it is stored."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import TINY_SPEC, write_spec

from fedhet.core.errors import RunError
from fedhet.core.spec import parse_spec
from fedhet.data import partition_stage
from fedhet.data.heterogeneity import (
    check_iid_labels,
    check_partition,
    client_measures,
    coefficient_of_variation,
    gini,
    heterogeneity,
    iid_reference,
)

CLASSES = 10


def test_one_class_per_client_against_the_closed_forms():
    """Ten equal clients, one class each: the pooled distribution is uniform, and each client's
    distances are those of a one-hot distribution from the uniform one."""
    measures = client_measures(np.eye(CLASSES, dtype=np.int64) * 50)
    middle = 0.5 * (1 + 1 / CLASSES)  # M = (p + q) / 2 at the client's class; 1/20 elsewhere
    kl_p = math.log2(1 / middle)
    kl_q = (1 / CLASSES) * math.log2((1 / CLASSES) / middle) + (1 - 1 / CLASSES) * math.log2(2)
    for m in measures:
        assert m["hellinger"] == pytest.approx(math.sqrt(1 - math.sqrt(1 / CLASSES)))
        assert m["jensen_shannon"] == pytest.approx(0.5 * (kl_p + kl_q))
        assert m["earth_movers"] == pytest.approx(2 * (1 - 1 / CLASSES))
    summary = heterogeneity(np.eye(CLASSES, dtype=np.int64) * 50)
    assert summary.classes_held == 1 and summary.size_cv == 0 and summary.size_gini == 0


def test_clients_with_the_pooled_distribution_differ_by_nothing():
    counts = np.tile(np.arange(1, CLASSES + 1), (4, 1)) * 3
    for m in client_measures(counts):
        assert m == pytest.approx(
            {"hellinger": 0, "jensen_shannon": 0, "earth_movers": 0}, abs=1e-7
        )


def test_quantity_skew_closed_forms():
    assert gini(np.array([5, 5, 5, 5])) == 0
    assert gini(np.array([0, 0, 0, 12])) == pytest.approx(3 / 4)  # (K - 1) / K
    assert coefficient_of_variation(np.array([1, 3])) == pytest.approx(0.5)


def test_the_iid_reference_shrinks_with_client_size():
    pooled = np.full(CLASSES, 1)
    small, _ = iid_reference(np.tile(pooled * 5, (10, 1)))
    large, _ = iid_reference(np.tile(pooled * 500, (10, 1)))
    assert 0 < large < small / 5  # sampling noise ~ 1 / sqrt(n)


@pytest.mark.parametrize(
    ("shares", "left_out", "says"),
    [
        ([[0, 1], [1, 2, 3]], 0, "2 samples are dealt|1 samples are dealt to two clients"),
        ([[0, 1], [2, 9]], 0, "outside the 4 training samples"),
        ([[0], [2]], 1, "2 of 4 samples belong to no client"),
    ],
)
def test_a_broken_partition_is_refused(shares, left_out, says):
    with pytest.raises(RunError, match=says):
        check_partition(shares, 4, left_out, "partition")


def test_a_scheme_that_leaves_samples_out_may():
    check_partition([[0], [2]], 4, None, "partition")  # subset, max_samples: any number


def test_the_stage_refuses_a_sample_in_two_clients(monkeypatch):
    """What the partition stage stores passes the checks: a scheme that dealt a sample twice
    stops the stage with one line."""
    spec = parse_spec({**TINY_SPEC, "partition": {"scheme": "iid", "clients": 3}})
    real = partition_stage.make_partition

    def twice(*args, **kwargs):
        part = real(*args, **kwargs)
        part.client_indices[1] = np.sort(
            np.append(part.client_indices[1], part.client_indices[0][0])
        )
        return part

    monkeypatch.setattr(partition_stage, "make_partition", twice)
    with pytest.raises(RunError, match="1 samples are dealt to two clients"):
        partition_stage.spec_partition(spec)


def test_label_sorted_blocks_from_an_iid_scheme_are_refused():
    """An 'iid' split of label-sorted data cut into blocks (Flower #7327) is label skew."""
    config = parse_spec({**TINY_SPEC, "partition": {"scheme": "iid", "clients": 5}}).partition
    blocks = np.zeros((5, CLASSES), dtype=np.int64)
    for client in range(5):
        blocks[client, 2 * client : 2 * client + 2] = 30
    with pytest.raises(RunError, match="scheme iid deals labels at random"):
        check_iid_labels(config, blocks, "partition")
    check_iid_labels(config, np.full((5, CLASSES), 6), "partition")  # a perfect split passes


SCHEMES = [
    {"scheme": "iid"},
    {"scheme": "dirichlet", "alpha": 0.1},
    {"scheme": "client_dirichlet"},
    {"scheme": "classes", "classes_per_client": 2},
    {"scheme": "subset"},
    {"scheme": "quantity"},
    {"scheme": "rotation"},
]


def test_fedhet_partition_prints_the_heterogeneity_of_every_scheme(fedhet, tmp_path):
    matrix = {"partition": [{"clients": 5, **s} for s in SCHEMES]}
    spec = write_spec(tmp_path / "spec.yaml", {**TINY_SPEC, "matrix": matrix})
    result = fedhet("partition", spec, "--store", tmp_path / "store")
    assert result.rc == 0, result.stderr
    text = " ".join(result.stdout.split())  # rich wraps long lines
    assert text.count("label skew: Hellinger") == len(SCHEMES)
    assert text.count("quantity skew: sizes' CV") == len(SCHEMES)
    assert "Hellinger" in result.stdout.splitlines()[2]  # the per-client column


def test_the_partition_figure_captions_each_panel_with_its_heterogeneity():
    from matplotlib.image import AxesImage

    from fedhet.figures import heatmaps_figure

    skew, even = np.eye(4, dtype=np.int64) * 10, np.full((4, 4), 5)
    histograms = {"natural, seed 0": skew, "natural, seed 1": skew.copy(), "iid, seed 0": even}
    fig = heatmaps_figure(histograms, lambda h: heterogeneity(h).caption())
    titles = [
        ax.get_title()
        for ax in fig.axes
        if any(isinstance(a, AxesImage) for a in ax.get_children())
    ]
    assert titles == [
        f"natural, seed 0, 1\n{heterogeneity(skew).caption()}",
        f"iid, seed 0\n{heterogeneity(even).caption()}",
    ]
    # one class of four each: Hellinger sqrt(1 - sqrt(1/4)), earth mover's 2 (1 - 1/4)
    assert "Hellinger 0.707" in titles[0] and "EMD 1.500" in titles[0]
    assert "1.0 of 4 classes a client" in titles[0]


def test_the_report_has_a_heterogeneity_row_per_partition(fedhet, tmp_path):
    from conftest import markdown_tables

    matrix = {"partition": [{"scheme": "iid", "clients": 4}, {"scheme": "classes", "clients": 5}]}
    spec = {**TINY_SPEC, "federation": {**TINY_SPEC["federation"], "rounds": 1}}
    path = write_spec(tmp_path / "spec.yaml", spec | {"matrix": matrix})
    out = tmp_path / "report"
    result = fedhet("report", path, "--train", "--store", tmp_path / "store", "--out", out)
    assert result.rc == 0, result.stderr
    text = (out / "tiny-digits.md").read_text()
    section = text.split("## Heterogeneity of the partitions")[1].split("\n## ")[0]
    (table,) = markdown_tables(section.splitlines())
    assert [row[0] for row in table[2:]] == [
        "digits iid, 4 clients, seed 3",
        "digits #C=2, 5 clients, seed 3",
    ]
    for row, partition in zip(table[2:], matrix["partition"], strict=True):
        histogram = partition_stage.spec_partition(parse_spec(spec | {"partition": partition}))
        h = heterogeneity(histogram.histogram)
        assert row[1:] == [
            str(partition["clients"]),
            f"{h.hellinger:.3f}",
            f"{h.iid_hellinger:.3f}",
            f"{h.jensen_shannon:.3f}",
            f"{h.earth_movers:.3f}",
            f"{h.classes_held:.1f} of 10",
            f"{h.size_cv:.2f}",
            f"{h.size_gini:.2f}",
        ]
