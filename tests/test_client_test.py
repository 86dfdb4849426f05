"""Per-client test sets (`eval.client_test`): drawn from the test split in each client's training
label proportions, seeded per client, keyed only by the partition and their size; `fedhet eval`
and `fedhet report` score each client on its own set with the model it uses (FedBN: its own BN
entries), and `--model best` of a personalized run falls back to final without failing the spec."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from conftest import TINY_SPEC, markdown_tables, write_spec

from fedhet.core.spec import Spec, load_spec
from fedhet.core.store import ArtifactStore
from fedhet.data.client_test import client_test_data, draw_client_tests
from fedhet.data.client_test_plan import client_test_node
from fedhet.data.datasets import load_dataset, rotate
from fedhet.data.partition import make_partition
from fedhet.data.partition_format import load_index_lists, save_index_lists, save_partition
from fedhet.engine import tensors
from fedhet.engine.run_format import read_client_states
from fedhet.engine.setup import build_setup
from fedhet.execution.planning import runs_of
from fedhet.metrics.accuracy import client_spread

PER_CLIENT = 30
TWO_CLASSES = {"scheme": "classes", "clients": 5, "classes_per_client": 2}


def spec_with(**changes) -> Spec:
    return Spec.model_validate({**TINY_SPEC, "partition": TWO_CLASSES, **changes})


def two_class_partition(seed: int = 0):
    digits = load_dataset("digits")
    part = make_partition(spec_with().partition, digits.train_y.numpy(), 10, seed)
    return digits, part


def test_each_clients_test_set_has_its_training_label_proportions():
    digits, part = two_class_partition()
    test_labels = digits.test_y.numpy()
    tests = draw_client_tests(part.histogram, test_labels, PER_CLIENT, seed=0)
    for counts, idx in zip(part.histogram, tests, strict=True):
        drawn = np.bincount(test_labels[idx], minlength=10)
        assert set(np.flatnonzero(drawn)) == set(np.flatnonzero(counts))  # its 2 classes only
        assert drawn.sum() == PER_CLIENT and len(np.unique(idx)) == PER_CLIENT
        # each class within one sample of its share of the client's training samples
        assert np.abs(drawn - PER_CLIENT * counts / counts.sum()).max() < 1
        assert idx.max() < len(test_labels)


def test_a_class_short_of_test_samples_gives_every_test_sample_it_has():
    digits, part = two_class_partition()
    test_labels = digits.test_y.numpy()
    available = np.bincount(test_labels, minlength=10)
    (idx, *_) = draw_client_tests(part.histogram, test_labels, 1000, seed=0)
    drawn = np.bincount(test_labels[idx], minlength=10)
    owned = part.histogram[0] > 0
    assert (drawn[owned] == available[owned]).all() and (drawn[~owned] == 0).all()


def test_draws_are_seeded_per_client():
    digits, part = two_class_partition()
    labels = digits.test_y.numpy()
    first = draw_client_tests(part.histogram, labels, PER_CLIENT, seed=0)
    again = draw_client_tests(part.histogram, labels, PER_CLIENT, seed=0)
    other = draw_client_tests(part.histogram, labels, PER_CLIENT, seed=1)
    assert all((a == b).all() for a, b in zip(first, again, strict=True))
    assert any(not np.array_equal(a, b) for a, b in zip(first, other, strict=True))
    # a client's draw depends on its own histogram row only, not on the clients before it
    alone = draw_client_tests(part.histogram[[0, 0, 2]], labels, PER_CLIENT, seed=0)
    assert np.array_equal(alone[2], first[2]) and np.array_equal(alone[0], first[0])


def test_an_empty_client_gets_no_test_set():
    histogram = np.array([[3, 1], [0, 0]])
    tests = draw_client_tests(histogram, np.array([0, 0, 0, 1, 1]), 4, seed=0)
    assert len(tests[0]) == 4 and len(tests[1]) == 0


@pytest.mark.parametrize("rotation", [None, {"step": 30}])
def test_client_test_samples_come_from_the_test_split(tmp_path, rotation):
    """Never training samples; with a rotation shift, in the client's own rotated domain."""
    spec = spec_with(partition={**TWO_CLASSES, "rotation": rotation})
    digits = load_dataset("digits")
    part = make_partition(spec.partition, digits.train_y.numpy(), 10, spec.seed)
    partition_group = zarr.open_group(tmp_path / "partition.zarr")
    tests_group = zarr.open_group(tmp_path / "client_test.zarr")
    save_partition(partition_group, part)
    tests = draw_client_tests(part.histogram, digits.test_y.numpy(), PER_CLIENT, spec.seed)
    save_index_lists(tests_group, tests)
    data = client_test_data(spec, partition_group, tests_group, torch.device("cpu"))
    setup = build_setup(spec, partition_group)
    for cid, (client, idx) in enumerate(zip(data, load_index_lists(tests_group), strict=True)):
        expected = digits.test_x[torch.from_numpy(idx)]
        if part.angles is not None and part.angles[cid] != 0:
            expected = rotate(expected, float(part.angles[cid]), digits.mean, digits.std)
        assert torch.equal(client.x, expected) and torch.equal(client.y, digits.test_y[idx])
        trained_on = {row.numpy().tobytes() for row in setup.clients[cid].x}
        assert not any(row.numpy().tobytes() in trained_on for row in client.x)


def test_the_option_enters_only_the_client_test_key():
    plain = spec_with()
    option = spec_with(eval={"client_test": {"per_client": PER_CLIENT}})
    assert client_test_node(plain) is None
    assert [n.key for n in runs_of(option)[0].node.walk()] == [
        n.key for n in runs_of(plain)[0].node.walk()
    ]
    node = client_test_node(option)
    assert node.upstream["partition"].key == runs_of(plain)[0].node.upstream["partition"].key
    bigger = spec_with(eval={"client_test": {"per_client": PER_CLIENT + 1}})
    reseeded = spec_with(seed=4, eval={"client_test": {"per_client": PER_CLIENT}})
    assert len({node.key, client_test_node(bigger).key, client_test_node(reseeded).key}) == 3


def test_client_spread_definitions():
    accuracies = [*np.linspace(0.0, 0.95, 20), math.nan]
    spread = client_spread(accuracies)
    measured = np.linspace(0.0, 0.95, 20)
    assert spread.mean == pytest.approx(measured.mean())
    assert spread.worst_decile == pytest.approx(measured[:2].mean())  # ceil(20 / 10) clients
    assert spread.std == pytest.approx(measured.std())
    assert client_spread([0.5, 0.7]).worst_decile == 0.5  # ceil(2 / 10) = 1 client
    assert math.isnan(client_spread([math.nan]).mean)


# --- through the command line -------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(fedhet, tmp_path_factory) -> tuple[Path, Path]:
    """(spec, store): FedAvg and FedBN with a BatchNorm MLP on a #C=2 partition, trained."""
    folder = tmp_path_factory.mktemp("client-test")
    spec = write_spec(
        folder / "spec.yaml",
        {
            **TINY_SPEC,
            "partition": TWO_CLASSES,
            "model": {"arch": "mlp", "hidden": [16], "norm": "batch"},
            "federation": {"rounds": 3, "batch_size": 32, "lr": 0.1, "local_steps": 5},
            "eval": {"client_test": {"per_client": PER_CLIENT}},
            "runtime": {"threads": 1, "progress": False, "device": "cpu"},
            "matrix": {"algorithm": [{"name": "fedavg"}, {"name": "fedbn"}]},
        },
    )
    store = folder / "store"
    result = fedhet("train", spec, "--store", store)
    assert result.rc == 0, result.stderr
    return spec, store


def accuracy(model: torch.nn.Module, state: tensors.Tensors, x, y) -> float:
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        return int((model(x).argmax(1) == y).sum()) / len(y)


def test_eval_scores_each_client_on_its_test_set_with_the_model_it_uses(fedhet, trained):
    spec_path, store = trained
    result = fedhet("eval", spec_path, "--json", "--store", store)
    assert result.rc == 0, result.stderr
    reports = json.loads(result.stdout)
    st = ArtifactStore(store)
    for run, report in zip(runs_of(load_spec(spec_path)), reports, strict=True):
        group = st.open("train", run.node.key)
        setup = build_setup(run.spec, st.open("partition", run.node.upstream["partition"].key))
        model = run.spec.algorithm.trainer_class()(run.spec.algorithm, setup).build_model()
        final = tensors.load(group["model"], "final", "cpu")
        own = read_client_states(group["model"]) if "clients" in group["model"] else {}
        node = client_test_node(run.spec)
        data = client_test_data(
            run.spec, st.open("partition", node.upstream["partition"].key),
            st.open("client_test", node.key), torch.device("cpu"),
        )  # fmt: skip
        uses = [{**final, **own.get(c.id, {})} for c in data]  # FedBN: its own BN entries
        expected = [accuracy(model, state, c.x, c.y) for state, c in zip(uses, data, strict=True)]
        # in percent, as every table shows accuracies
        assert report["client_test_pct"] == pytest.approx([100 * e for e in expected], abs=1e-10)
        spread = client_spread(expected)
        assert report["client_test_mean_pct"] == pytest.approx(100 * spread.mean, abs=1e-10)
        worst = report["client_test_worst_decile_pct"]
        assert worst == pytest.approx(100 * spread.worst_decile, abs=1e-10)
        assert report["client_test_std_pct"] == pytest.approx(100 * spread.std, abs=1e-10)
        if run.spec.algorithm.personalized:  # the server's BN entries would score otherwise
            server = [accuracy(model, final, c.x, c.y) for c in data]
            assert server != pytest.approx(expected, abs=1e-9)
    table = fedhet("eval", spec_path, "--store", store)
    assert table.rc == 0 and "worst 10%" in table.stdout and "own test set" in table.stdout


def test_eval_model_best_with_a_personalized_run_in_the_spec_exits_0(fedhet, trained):
    spec_path, store = trained
    result = fedhet("eval", spec_path, "--json", "--model", "best", "--store", store)
    assert result.rc == 0, result.stderr
    fedavg, fedbn = json.loads(result.stdout)
    assert fedavg["model"] == "best" and fedbn["model"] == "final"
    lines = [line for line in result.stderr.splitlines() if "best not stored" in line]
    assert len(lines) == 1 and "fedbn" in lines[0].lower() and "using final" in lines[0]
    (run_fedbn,) = [r for r in runs_of(load_spec(spec_path)) if r.spec.algorithm.personalized]
    group = ArtifactStore(store).open("train", run_fedbn.node.key)
    final = group["metrics"]["test_accuracy"][-1]
    assert fedbn["client_test_weighted_mean_pct"] == pytest.approx(100 * final, abs=1e-4)


def test_report_has_the_per_client_test_accuracy_tables(fedhet, trained, tmp_path):
    spec_path, store = trained
    result = fedhet("report", spec_path, "--store", store, "--out", tmp_path)
    assert result.rc == 0, result.stderr
    text = (tmp_path / f"{load_spec(spec_path).name}.md").read_text()
    section = text.split("\n## Personalized accuracy\n")[1].split("\n## ")[0]
    table = markdown_tables(section.splitlines())[0]
    columns = {"mean (%)": "mean", "worst 10% (%)": "worst_decile", "std over clients (%)": "std"}
    evaluated = json.loads(fedhet("eval", spec_path, "--json", "--store", store).stdout)
    for header, field in columns.items():
        cells = {row[0]: row[table[0].index(header)] for row in table[2:]}
        for report in evaluated:
            value = report[f"client_test_{field}_pct"]
            assert cells[report["algorithm"]] == f"{value:.2f} (n=1)"
