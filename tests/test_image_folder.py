"""A folder of images (`data: {dataset: images, path: ...}`, fedhet.data.image_folder): a
subfolder per class, or per client and then per class, read into the arrays fedhet trains on,
with the client folders as the natural partition and the files' content in the key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import CliRunner, write_spec
from PIL import Image

from fedhet.core.spec import parse_spec
from fedhet.data.datasets import load_data
from fedhet.data.partition_plan import partition_node
from fedhet.data.partition_stage import spec_partition

SITES = {"site-b": 4, "site-a": 6}  # images per class


def image_folder(root: Path, side: int = 8, sites: dict[str, int] = SITES) -> Path:
    """<site>/<class>/<image>.png: class c's images are grey c * 100 plus noise."""
    rng = np.random.default_rng(0)
    for site, count in sites.items():
        for label, name in enumerate(["cat", "dog"]):
            folder = root / site / name
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = np.clip(label * 100 + rng.integers(0, 50, (side, side)), 0, 255)
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{i}.png")
    return root


def spec_of(path: Path, **data) -> dict:
    return {
        "data": {"dataset": "images", "path": str(path), **data},
        "partition": {"scheme": "natural"},
        "model": {"arch": "simple_cnn"},
    }


def test_client_folders_are_the_natural_partition_and_class_folders_the_labels(tmp_path: Path):
    root = image_folder(tmp_path / "sites")
    spec = parse_spec(spec_of(root, test=str(root)))  # every image trains
    assert spec.partition.clients == 2
    data, part = load_data(spec.data, seed=0), spec_partition(spec)
    assert data.shape == (1, 8, 8) and data.classes == ("0", "1")
    assert [len(k) for k in part.client_indices] == [2 * SITES["site-a"], 2 * SITES["site-b"]]
    assert part.histogram.tolist() == [[6, 6], [4, 4]]  # site-a, then site-b: sorted
    dogs = data.train_x[data.train_y == 1]
    assert float(dogs.min()) >= 100 / 255 and float(data.train_x.max()) <= 1


def test_a_changed_image_or_size_changes_the_key(tmp_path: Path):
    root = image_folder(tmp_path / "sites")
    key = partition_node(parse_spec(spec_of(root))).key
    assert partition_node(parse_spec(spec_of(root, size=16))).key != key
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(root / "site-a" / "cat" / "0.png")
    assert partition_node(parse_spec(spec_of(root))).key != key


def test_class_folders_alone_make_a_dataset_without_clients(tmp_path: Path):
    root = image_folder(tmp_path / "sites") / "site-a"
    spec = parse_spec({**spec_of(root), "partition": {"scheme": "iid", "clients": 2}})
    assert spec.data.describe().clients is None and spec.data.describe().classes == 2


@pytest.mark.parametrize(
    ("make", "data", "expected"),
    [
        (lambda root: root, {"test": "missing"}, "data.test: folder not found"),
        (
            lambda root: image_folder(root, side=12, sites={"site-c": 1}),
            {},
            "data.path: images of sizes 8x8, 12x12; set data.size to resize them all",
        ),
        (
            lambda root: (root / "site-a" / "cat" / "bad.png").write_text("no image") and root,
            {},
            "site-a/cat/bad.png: not an image Pillow can read; remove or replace it",
        ),
        (
            lambda root: (root / "site-a" / "cat" / "empty.png").write_bytes(b"") or root,
            {},
            "site-a/cat/empty.png: an empty file (0 bytes); remove or replace it",
        ),
    ],
)
def test_a_bad_folder_is_refused_in_one_line(
    fedhet: CliRunner, tmp_path: Path, make, data: dict, expected: str
):
    root = make(image_folder(tmp_path / "sites"))
    spec = spec_of(Path("sites"), **data)
    result = fedhet("spec", "validate", write_spec(tmp_path / "s.yaml", spec), cwd=tmp_path)
    assert result.rc == 2 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip("\n").splitlines()
    assert expected in line and root.exists()
