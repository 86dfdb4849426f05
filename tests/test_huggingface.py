"""Hugging Face datasets (`data: {dataset: huggingface, ...}`, fedhet.data.huggingface): a
save_to_disk folder, a folder of Parquet or Arrow files and a hub name in the local cache, each
built here with the `datasets` library (nothing is fetched); natural partitions by a column and
grouped natural ids; the columns' errors; the content hash in the key."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import CliRunner, cli_env, write_spec

from fedhet.core.errors import InputError
from fedhet.core.spec import parse_spec
from fedhet.data.datasets import load_data
from fedhet.data.partition_plan import partition_node
from fedhet.data.partition_stage import spec_partition

datasets = pytest.importorskip("datasets")
WRITERS = ["ann", "bob", "cy", "dee", "eve", "fay", "gus"]


@pytest.fixture(autouse=True)
def _library_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `load_dataset` converts goes under tmp_path, not the user's cache."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")


def splits(train: int = 42, test: int = 14, seed: int = 0) -> dict[str, dict[str, list]]:
    """Columns x (4 floats), label (3 classes) and writer of a training and a test split; the
    test split's last writer, zed, writes no training sample."""
    rng = np.random.default_rng(seed)

    def split(n: int, writers: list[str]) -> dict[str, list]:
        return {
            "x": rng.normal(size=(n, 4)).round(3).astype(np.float32).tolist(),
            "label": rng.integers(0, 3, n).tolist(),
            "writer": [writers[i % len(writers)] for i in range(n)],
        }

    return {"train": split(train, WRITERS), "test": split(test, [*WRITERS, "zed"])}


def saved(root: Path, columns: dict[str, dict[str, list]] | None = None) -> Path:
    parts = {name: datasets.Dataset.from_dict(c) for name, c in (columns or splits()).items()}
    datasets.DatasetDict(parts).save_to_disk(str(root))
    return root


def spec_of(path: Path | str, partition: dict | None = None, **data: object) -> dict:
    return {
        "data": {"dataset": "huggingface", "path": str(path), **data},
        "partition": partition or {"scheme": "natural", "by": "writer"},
        "model": {"arch": "mlp", "hidden": [8]},
        "federation": {"rounds": 2, "clients_per_round": 2, "batch_size": 4, "lr": 0.05},
    }


def test_a_saved_dataset_gives_one_client_per_value_of_a_column(tmp_path: Path):
    columns = splits()
    spec = parse_spec(spec_of(saved(tmp_path / "saved", columns)))
    assert spec.partition.clients == len(WRITERS)
    data, part = load_data(spec.data, seed=0), spec_partition(spec)
    assert data.shape == (1, 1, 4) and data.num_classes == 3
    train = columns["train"]
    assert np.array_equal(data.train_x.reshape(-1, 4).numpy(), np.float32(train["x"]))
    for client, writer in enumerate(sorted(WRITERS)):  # values sorted: clients 0..K-1
        rows = [i for i, w in enumerate(train["writer"]) if w == writer]
        assert part.client_indices[client].tolist() == rows
    test_writers = np.array(columns["test"]["writer"])
    expected = [sorted(WRITERS).index(w) if w in WRITERS else -1 for w in test_writers]
    assert data.test_client.tolist() == expected and -1 in expected  # zed: scored globally


def test_grouped_natural_ids_deal_that_many_values_to_a_client(tmp_path: Path):
    root = saved(tmp_path / "saved")
    natural = {"scheme": "natural", "by": "writer", "group": 3}
    spec = parse_spec(spec_of(root, natural) | {"eval": {"client_test": {}}})
    assert spec.partition.clients == 3  # 7 writers: 3, 3 and 1
    single = spec_partition(parse_spec(spec_of(root)))
    grouped = spec_partition(spec)
    for client, members in enumerate([(0, 1, 2), (3, 4, 5), (6,)]):
        joined = np.sort(np.concatenate([single.client_indices[m] for m in members]))
        assert grouped.client_indices[client].tolist() == joined.tolist()
    ungrouped = partition_node(parse_spec(spec_of(root))).key
    assert partition_node(spec).key != ungrouped


def test_grouped_ids_apply_to_any_natural_data():
    """FedProx's synthetic benchmark: its 30 clients, 4 a client, are 8 (the last holds 2)."""
    data = {"dataset": "synthetic", "alpha": 1, "beta": 1}
    single = spec_partition(parse_spec({"data": data, "partition": {"scheme": "natural"}}))
    spec = parse_spec({"data": data, "partition": {"scheme": "natural", "group": 4}})
    assert spec.partition.clients == 8
    sizes = [len(c) for c in single.client_indices]
    expected = [sum(sizes[k : k + 4]) for k in range(0, 30, 4)]
    assert [len(c) for c in spec_partition(spec).client_indices] == expected


@pytest.mark.parametrize("layout", ["parquet", "arrow"])
def test_a_folder_of_files_reads_images_as_pixels(tmp_path: Path, layout: str):
    from PIL import Image

    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (10, 5, 6), dtype=np.uint8)
    images = [Image.fromarray(p) for p in pixels]
    features = datasets.Features(
        {"img": datasets.Image(), "y": datasets.ClassLabel(names=["a", "b", "c", "d"])}
    )
    folder = tmp_path / layout
    folder.mkdir()
    for name, rows in (("train", slice(0, 7)), ("test", slice(7, 10))):
        part = datasets.Dataset.from_dict(
            {"img": images[rows], "y": [i % 2 for i in range(10)][rows]}, features=features
        )
        if layout == "parquet":
            part.to_parquet(str(folder / f"{name}-00000-of-00001.parquet"))
        else:
            part.save_to_disk(str(tmp_path / name))
            shutil.copy(next((tmp_path / name).glob("*.arrow")), folder / f"{name}.arrow")
    spec = parse_spec(spec_of(folder, {"scheme": "iid", "clients": 2}))
    data = load_data(spec.data, seed=0)
    assert data.shape == (1, 5, 6) and data.num_classes == 4  # the ClassLabel's classes
    assert np.allclose(data.train_x.numpy()[:, 0], pixels[:7] / 255, atol=1e-7)
    assert data.test_y.tolist() == [1, 0, 1]


def hub_cache(root: Path, parquet: Path) -> Path:
    """A datasets cache holding hub dataset someone/tiny, as a first `load_dataset` leaves it
    (`<cache>/someone___tiny/default/0.0.0/<hash>/tiny-<split>.arrow`), built offline."""
    files = {s: str(parquet / f"{s}.parquet") for s in ("train", "test")}
    built = datasets.load_dataset("parquet", data_files=files, cache_dir=str(root / "build"))
    source = Path(built["train"].cache_files[0]["filename"]).parent
    target = root / "datasets" / "someone___tiny" / "default" / "0.0.0" / source.name
    shutil.copytree(source, target)
    for file in glob.glob(str(target / "parquet-*")):
        os.rename(file, file.replace("parquet-", "tiny-"))
    info = target / "dataset_info.json"
    info.write_text(info.read_text().replace('"dataset_name": "parquet"', '"dataset_name": "tiny"'))
    return root / "datasets"


def test_a_hub_name_reads_from_the_cache_and_nothing_is_fetched(fedhet: CliRunner, tmp_path: Path):
    parquet = tmp_path / "parquet"
    parquet.mkdir()
    for name, columns in splits().items():
        datasets.Dataset.from_dict(columns).to_parquet(str(parquet / f"{name}.parquet"))
    cache = hub_cache(tmp_path / "hf", parquet)
    env = cli_env(tmp_path / "store", HF_DATASETS_CACHE=str(cache), HF_HOME=str(tmp_path / "h"))
    spec = spec_of("someone/tiny", {"scheme": "iid", "clients": 2})
    found = fedhet(
        "partition", write_spec(tmp_path / "hub.yaml", spec), "--format", "json", env=env
    )
    assert found.rc == 0, found.stderr
    assert sum(row["size"] for row in json.loads(found.stdout)) == 42  # its training samples
    absent = spec_of("someone/absent", {"scheme": "iid", "clients": 2})
    refused = fedhet("spec", "validate", write_spec(tmp_path / "absent.yaml", absent), env=env)
    assert refused.rc == 2 and "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "data.path: not a folder, nor a dataset in the local Hugging Face cache" in (
        refused.stderr
    )
    assert "set data.download: true to fetch it" in refused.stderr


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"data": {"input": "pixels"}}, "data.input: no column 'pixels' in split train (its "),
        ({"data": {"label": "writer"}}, "data.label: column 'writer' holds text; give integer"),
        ({"data": {"input": "writer"}}, "data.input: column 'writer' holds text, which this"),
        ({"data": {"test_split": "valid"}}, "has no split 'valid' (its splits: train, test)"),
        ({"partition": {"scheme": "natural", "by": "author"}}, "partition.by: no column"),
        ({"partition": {"scheme": "natural"}}, "partition.by: a natural partition of dataset"),
        ({"columns": "no defaults"}, "data.input: none of the columns image, img, x in split"),
    ],
)
def test_a_column_problem_is_refused_in_one_line(
    fedhet: CliRunner, tmp_path: Path, change: dict, expected: str
):
    columns = splits()
    if "columns" in change:
        columns = {n: {"v" if k == "x" else k: c for k, c in s.items()} for n, s in columns.items()}
    spec = spec_of(saved(tmp_path / "saved", columns))
    spec["data"] |= change.get("data", {})
    spec["partition"] = change.get("partition", spec["partition"])
    result = fedhet("spec", "validate", write_spec(tmp_path / "s.yaml", spec))
    assert result.rc == 2 and "Traceback" not in result.stderr
    assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1
    if "columns" in change:
        assert "(its columns: v, label, writer)" in result.stderr


def test_only_a_dataset_with_columns_takes_partition_by():
    with pytest.raises(InputError, match="partition.by: dataset digits has no columns"):
        parse_spec({"partition": {"scheme": "natural", "by": "writer"}})


def test_the_key_changes_exactly_when_the_data_change(tmp_path: Path):
    root = saved(tmp_path / "saved")
    key = partition_node(parse_spec(spec_of(root))).key
    moved = root.rename(tmp_path / "moved")
    spec = parse_spec(spec_of(moved))
    assert partition_node(spec).key == key
    assert partition_node(parse_spec(spec_of(moved, input="x"))).key == key  # the default
    changed = splits()
    changed["train"]["x"][0][0] += 1.0
    other = saved(tmp_path / "other", changed)
    assert partition_node(parse_spec(spec_of(other))).key != key
    shutil.rmtree(moved)  # replaced while `spec`'s runs are planned: refused when loaded
    shutil.copytree(other, moved)
    with pytest.raises(InputError, match=f"data.path: {moved} changed while fedhet"):
        load_data(spec.data, seed=0)


def test_fedavg_and_fedprox_train_on_a_saved_dataset(fedhet: CliRunner, tmp_path: Path):
    spec = spec_of(saved(tmp_path / "saved")) | {"eval": {"client_test": {}}}
    spec["matrix"] = {"algorithm": [{"name": "fedavg"}, {"name": "fedprox", "mu": 0.1}]}
    path, store = write_spec(tmp_path / "hf.yaml", spec), tmp_path / "store"
    trained = fedhet("train", path, store=store)
    assert trained.rc == 0, trained.stderr
    assert trained.stderr.count("round 2/2") == 2 and "natural by writer" in trained.stdout
    scored = fedhet("eval", path, store=store)
    assert scored.rc == 0, scored.stderr
    assert scored.stdout.count("own test sets: client mean") == 2


def test_the_library_is_imported_only_to_read_a_dataset():
    probe = (
        "import sys, fedhet, fedhet.cli, fedhet.data.huggingface\n"
        "from fedhet.core.spec import parse_spec\n"
        "parse_spec({'data': {'dataset': 'digits'}})\n"
        "print('datasets' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stdout + proc.stderr
