"""FedBR's RotatedMNIST protocol confounds class and angle (issue 31): each class sits mostly on
one client, hence at one angle, while the test set shows it at every client's angle. The sanity
metric shows each test class at its own training angle instead."""

from __future__ import annotations

import numpy as np
import torch
import yaml
from conftest import TINY_SPEC, CliRunner

from fedhet.data.datasets import load_dataset
from fedhet.data.partition import Partition
from fedhet.engine.setup import own_angle_test


def test_each_test_class_is_turned_by_the_angle_of_the_client_holding_most_of_it():
    ds = load_dataset("digits")
    histogram = np.zeros((4, 10), dtype=np.int64)
    for label in range(10):
        histogram[label % 4, label] = 5  # class c mostly on client c mod 4
        histogram[(label + 1) % 4, label] = 2
    angles = np.array([0.0, 90.0, 180.0, 270.0])
    part = Partition([np.arange(1)] * 4, histogram, angles)
    turned = own_angle_test(ds, part)
    for label in range(10):
        members = ds.test_y == label
        quarter_turns = (label % 4) % 4  # client c mod 4 holds the class, at 90 * (c mod 4)
        expected = torch.rot90(ds.test_x[members], quarter_turns, dims=(2, 3))
        assert torch.allclose(turned[members], expected, atol=1e-5), label


def test_eval_and_report_show_it_for_a_rotated_partition_only(fedhet: CliRunner, tmp_path):
    rotated = {
        **TINY_SPEC,
        "name": "rotated",
        "partition": {"scheme": "classes", "clients": 5, "classes_per_client": 2,
                      "rotation": {"step": 90}},
        "runtime": {"threads": 1, "progress": False},
        "matrix": {"seed": [0, 1]},
    }  # fmt: skip
    path = tmp_path / "rotated.yaml"
    path.write_text(yaml.safe_dump(rotated))
    store = tmp_path / "store"
    report = fedhet("report", path, "--train", "--out", tmp_path, "--store", store)
    assert report.rc == 0, report.stderr
    text = (tmp_path / "rotated.md").read_text()
    assert "## Accuracy at each class's own training angle" in text
    evaluated = fedhet("eval", path, "--format", "csv", "--store", store)
    assert evaluated.rc == 0 and "own_angle" in evaluated.stdout.splitlines()[0]
    plain = fedhet("eval", path, "partition.rotation=null", "--train", "--format", "csv",
                   "--store", store)  # fmt: skip
    assert plain.rc == 0 and "own_angle" not in plain.stdout
