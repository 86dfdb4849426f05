"""A user's own data (`data: {dataset: arrays, path: ...}`, fedhet.data.arrays): `.npz` and
Parquet files read and checked, the natural partition from their client ids, the files' content
in the partition's key, bad files refused in one line (exit 2), and every method trained on one
from the command line and from `fedhet.load`."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import CliRunner, write_spec
from sklearn.datasets import load_digits

import fedhet
from fedhet.core.errors import InputError
from fedhet.core.spec import parse_spec
from fedhet.data.datasets import load_data
from fedhet.data.partition_plan import partition_node
from fedhet.data.partition_stage import spec_partition

SITES = np.array(["north", "south", "east", "west", "clinic-9"])


def digits_npz(path: Path, **changes: np.ndarray) -> Path:
    """Digits as a user would save them: 8x8 images, labels and a shuffled site per image."""
    digits = load_digits()
    site = SITES[np.random.default_rng(0).integers(0, len(SITES), len(digits.target))]
    arrays = {"x": digits.images.astype(np.float32) / 16, "y": digits.target, "client": site}
    np.savez(path, **(arrays | changes))
    return path


def spec_of(path: Path, **data) -> dict:
    return {
        "data": {"dataset": "arrays", "path": str(path), **data},
        "partition": {"scheme": "natural"},
        "model": {"arch": "mlp", "hidden": [16]},
    }


def test_the_natural_partition_is_the_client_column(tmp_path: Path):
    path = digits_npz(tmp_path / "mine.npz")
    spec = parse_spec(spec_of(path, test=str(path)))  # a given test file: every row trains
    assert spec.partition.clients == len(SITES)
    part, site = spec_partition(spec), np.load(path)["client"]
    expected = [np.flatnonzero(site == name) for name in sorted(SITES)]  # sorted ids: 0..K-1
    assert [list(k) for k in part.client_indices] == [list(k) for k in expected]
    assert part.histogram.sum() == len(site)


def test_a_validation_split_holds_out_part_of_each_natural_client(tmp_path: Path):
    path = digits_npz(tmp_path / "mine.npz")
    spec = parse_spec(spec_of(path, test=str(path), validation=0.2))
    part, site = spec_partition(spec), np.load(path)["client"]
    clients = zip(sorted(SITES), part.client_indices, part.validation_indices, strict=True)
    for name, kept, held in clients:
        assert set(kept) | set(held) == set(np.flatnonzero(site == name))
        assert len(held) == pytest.approx(0.2 * (len(kept) + len(held)), abs=6)  # per class


def test_the_held_out_test_split_is_each_clients_and_the_same_for_every_seed(tmp_path: Path):
    path = digits_npz(tmp_path / "mine.npz")
    spec = parse_spec(spec_of(path, test_fraction=0.25))
    first, second = load_data(spec.data, seed=0), load_data(spec.data, seed=1)
    assert np.array_equal(first.test_x.numpy(), second.test_x.numpy())
    site = np.load(path)["client"]
    rows = np.bincount(np.unique(site, return_inverse=True)[1])
    kept = np.bincount(first.train_client)
    np.testing.assert_allclose(1 - kept / rows, 0.25, atol=0.03)  # per class, rounded half up
    assert len(first.train_y) + len(first.test_y) == len(site)


def test_a_changed_file_changes_the_partition_key_and_a_moved_one_does_not(tmp_path: Path):
    path = digits_npz(tmp_path / "mine.npz")
    key = partition_node(parse_spec(spec_of(path))).key
    moved = shutil.copy(path, tmp_path / "moved.npz")
    assert partition_node(parse_spec(spec_of(moved))).key == key
    labels = load_digits().target.copy()
    labels[0] = (labels[0] + 1) % 10
    digits_npz(path, y=labels)
    assert partition_node(parse_spec(spec_of(path))).key != key


def test_parquet_holds_the_same_data_as_npz(tmp_path: Path):
    path = digits_npz(tmp_path / "mine.npz", x=load_digits().data)  # one column per feature
    arrays = np.load(path)
    columns = {f"pixel{j}": arrays["x"][:, j] for j in range(arrays["x"].shape[1])}
    table = pa.table(columns | {"y": arrays["y"], "client": arrays["client"]})
    pq.write_table(table, tmp_path / "mine.parquet")
    npz = load_data(parse_spec(spec_of(path)).data, seed=0)
    parquet = load_data(parse_spec(spec_of(tmp_path / "mine.parquet")).data, seed=0)
    assert parquet.shape == npz.shape == (1, 1, 64)
    assert np.array_equal(parquet.train_x.numpy(), npz.train_x.numpy())
    assert np.array_equal(parquet.train_client, npz.train_client)


def test_samples_are_used_as_given_in_their_own_shape(tmp_path: Path):
    path = digits_npz(tmp_path / "mine.npz")
    data = load_data(parse_spec(spec_of(path, test=str(path))).data, seed=0)
    assert data.shape == (1, 8, 8) and data.num_classes == 10
    np.testing.assert_array_equal(data.train_x.numpy()[:, 0], np.load(path)["x"])
    with pytest.raises(InputError, match="data.resize: applies to the built-in image datasets"):
        parse_spec(spec_of(path, resize=16))


DIGITS = load_digits()
REFUSED = [
    ({"x": DIGITS.images}, {"y": None}, {}, "data.path: no array y"),
    ({}, {"x": np.full((1797, 8, 8), np.nan)}, {}, "data.path: x holds NaN or infinite"),
    ({}, {"y": DIGITS.target.astype(float)}, {}, "data.path: y is float64"),
    ({}, {"client": np.arange(3)}, {}, "data.path: client has 3 values for the 1797 rows of x"),
    ({}, {}, {"classes": 5}, "data.path: label 9 outside 0..4 (classes: 5)"),
    ({}, {}, {"path": "elsewhere.npz"}, "data.path: file not found"),
    ({}, {}, {"scale": "unit"}, "data.scale: applies to the built-in image datasets only"),
]


@pytest.mark.parametrize(("base", "changes", "data", "expected"), REFUSED)
def test_a_bad_file_is_refused_in_one_line_naming_it(
    fedhet: CliRunner, tmp_path: Path, base, changes, data, expected
):
    arrays = {"x": DIGITS.images, "y": DIGITS.target, "client": DIGITS.target % 3}
    arrays = {k: v for k, v in (arrays | base | changes).items() if v is not None}
    np.savez(tmp_path / "mine.npz", **arrays)
    spec = {**spec_of(Path("mine.npz")), "data": {**spec_of(Path("mine.npz"))["data"], **data}}
    result = fedhet("spec", "validate", write_spec(tmp_path / "s.yaml", spec), cwd=tmp_path)
    assert result.rc == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip("\n").splitlines()
    assert line.startswith("error: ") and expected in line, line
    assert "mine.npz" in line or "elsewhere.npz" in line or "scale" in line


NATURAL = {"scheme": "natural"}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"partition": NATURAL}, "natural needs data with client ids, which digits"),
        (
            {"data": {"dataset": "arrays", "path": "plain.npz"}, "partition": NATURAL},
            "natural needs data with client ids, which arrays",
        ),
        (
            {
                "data": {"dataset": "arrays", "path": "mine.npz"},
                "partition": NATURAL | {"clients": 4},
            },
            "partition.clients: 4 for the 5 clients of the data; remove it",
        ),
    ],
)
def test_a_natural_partition_needs_the_datas_clients(
    fedhet: CliRunner, tmp_path: Path, spec: dict, expected: str
):
    digits_npz(tmp_path / "mine.npz")
    np.savez(tmp_path / "plain.npz", x=DIGITS.data, y=DIGITS.target)
    result = fedhet("spec", "validate", write_spec(tmp_path / "s.yaml", spec), cwd=tmp_path)
    assert result.rc == 2 and expected in result.stderr and len(result.stderr.splitlines()) == 1


EVERY_METHOD = [
    {"name": "fedavg"},
    {"name": "fedprox", "mu": 0.01},
    {"name": "scaffold"},
    {"name": "fednova"},
    {"name": "centralized"},
    {
        "name": "tct",
        "stage1": {"rounds": 1},
        "entk": {"subsample": 50, "dtype": "fp32"},
        "stage2": {"rounds": 2, "local_steps": 2, "lr": 0.001},
    },
    {"name": "fedavg", "vhl": {}},
    {"name": "fedimpro"},
    {"name": "fedbr"},
    {"name": "moon", "projection_width": 8},
    {"name": "local"},
    {"name": "fedtan"},
    {"name": "fedtan_ii"},
    {"name": "fedavg_alg2"},
    {"name": "fedbn"},
    {"name": "silobn"},
]


@pytest.mark.slow
def test_every_method_trains_on_a_users_npz_with_its_clients(fedhet: CliRunner, tmp_path: Path):
    digits_npz(tmp_path / "mine.npz")
    spec = {
        "name": "mine",
        "seed": 1,
        "data": {"dataset": "arrays", "path": "mine.npz"},
        "partition": {"scheme": "natural"},
        "model": {"arch": "mlp", "hidden": [8], "norm": "batch"},  # BatchNorm for FedTAN & co.
        "federation": {"rounds": 2, "batch_size": 32, "lr": 0.05, "local_steps": 2},
        "runtime": {"threads": 1, "progress": False, "device": "cpu"},
        "matrix": {"algorithm": EVERY_METHOD},
    }
    path = write_spec(tmp_path / "mine.yaml", spec)
    trained = fedhet("train", path, "--store", tmp_path / "store", cwd=tmp_path)
    assert trained.rc == 0, trained.stderr
    # one train artifact each (TCT's is its stage 1)
    assert len(list((tmp_path / "store" / "train").glob("*.zarr"))) == len(EVERY_METHOD)
    listed = fedhet("runs", path, "--store", tmp_path / "store", "--format", "csv", cwd=tmp_path)
    assert listed.rc == 0 and listed.stdout.count(",stored,") == len(EVERY_METHOD)


def test_fedhet_load_trains_a_users_npz(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)  # a relative path is the working directory's
    digits_npz(tmp_path / "mine.npz")
    spec = {
        **spec_of(Path("mine.npz")),
        "federation": {"rounds": 10, "batch_size": 32, "lr": 0.2},
        "runtime": {"threads": 1, "progress": False, "device": "cpu"},
    }
    experiment = fedhet.load(spec, store=tmp_path / "store")
    rows = experiment.train()
    assert len(rows) == 1 and rows.iloc[0]["final_pct"] > 70  # chance: 10%
    assert list(experiment.runs()["state"]) == ["stored"]
