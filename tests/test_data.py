import gzip
import shutil

import numpy as np
import pytest
import torch
from torchvision.transforms import functional as tvf

from fedhet.core.errors import InputError
from fedhet.data import datasets as data
from fedhet.data import torchvision_sets as torchvision
from fedhet.data.datasets import dataset_names, load_dataset, rotate

torch.set_num_threads(1)

DEBIAN_PRESENT = torchvision.debian_fashion_mnist_present()
needs_debian_fmnist = pytest.mark.skipif(
    not DEBIAN_PRESENT,
    reason=f"Fashion-MNIST not installed at {torchvision.DEBIAN_FASHION_MNIST} "
    "(apt-get install dataset-fashion-mnist)",
)


@pytest.fixture
def release_cache():
    """Full-size datasets loaded from throwaway roots: free their memory afterwards."""
    yield
    data._load_cached.cache_clear()


def denormalize(dataset, x):
    mean = torch.tensor(dataset.mean).view(1, -1, 1, 1)
    std = torch.tensor(dataset.std).view(1, -1, 1, 1)
    return x.double() * std.double() + mean.double()


def test_dataset_names():
    assert set(dataset_names()) == {
        "digits",
        "fmnist",
        "mnist",
        "cifar10",
        "cifar100",
        "svhn",
        "emnist",
    }


def test_digits_shapes_split_and_normalization():
    from sklearn.datasets import load_digits

    digits = load_digits()
    ds = load_dataset("digits")
    assert ds.shape == (1, 8, 8) and ds.num_classes == 10
    assert ds.train_x.dtype == torch.float32 and ds.train_y.dtype == torch.int64
    assert len(ds.train_x) + len(ds.test_x) == 1797
    test_counts = torch.bincount(ds.test_y, minlength=10).numpy()
    np.testing.assert_allclose(test_counts, 0.2 * np.bincount(digits.target), atol=0.5)
    # normalized: the training set has mean 0 and (population) std 1
    assert abs(ds.train_x.mean().item()) < 1e-5
    assert ds.train_x.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)
    # undoing the normalization recovers the original 0..16 grey levels
    levels = denormalize(ds, ds.train_x) * 16
    assert torch.allclose(levels, levels.round(), atol=1e-4)
    assert levels.round().min() == 0 and levels.round().max() == 16
    # every training image is one of the original images, with its label
    originals = {
        (img.tobytes(), int(y))
        for img, y in zip(digits.images.astype(np.uint8), digits.target, strict=True)
    }
    for img, y in zip(
        levels.round().to(torch.uint8)[:, 0].numpy(), ds.train_y.tolist(), strict=True
    ):
        assert (img.tobytes(), y) in originals


def test_digits_without_the_bundled_csv_come_from_scikit_learn_alike(monkeypatch, tmp_path):
    """fedhet reads scikit-learn's digits.csv.gz directly (no scikit-learn import); where that
    file is not at its place, load_digits gives the same table."""
    from types import SimpleNamespace

    from fedhet.data import digits

    direct = digits._bundled_digits()
    elsewhere = SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    finder = SimpleNamespace(find_spec=lambda name: elsewhere)
    monkeypatch.setattr(digits, "importlib", SimpleNamespace(util=finder))
    np.testing.assert_array_equal(digits._bundled_digits(), direct)
    assert direct.shape == (1797, 65)


def test_digits_split_is_fixed():
    first = load_dataset("digits")
    data._load_cached.cache_clear()
    again = load_dataset("digits")
    assert first is not again
    assert torch.equal(first.train_x, again.train_x) and torch.equal(first.test_y, again.test_y)


def test_loading_is_cached():
    assert load_dataset("digits") is load_dataset("digits")


@needs_debian_fmnist
def test_fmnist_loads_from_the_debian_folder(tmp_path, release_cache):
    ds = load_dataset("fmnist", root=tmp_path)  # an empty root: only the Debian folder has it
    assert ds.train_x.shape == (60_000, 1, 28, 28) and ds.test_x.shape == (10_000, 1, 28, 28)
    assert ds.classes[0] == "T-shirt/top" and ds.num_classes == 10
    assert torch.bincount(ds.train_y).tolist() == [6000] * 10
    # the published Fashion-MNIST constants
    assert ds.mean[0] == pytest.approx(0.2860, abs=1e-4)
    assert ds.std[0] == pytest.approx(0.3530, abs=1e-4)
    assert abs(ds.train_x.mean().item()) < 1e-4


@needs_debian_fmnist
def test_fmnist_in_a_data_root_reads_through_torchvision(tmp_path, monkeypatch, release_cache):
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for file in torchvision._DEBIAN_FILES:
        debian = torchvision.DEBIAN_FASHION_MNIST / file
        with gzip.open(debian) as src, open(raw / file[:-3], "wb") as dst:
            shutil.copyfileobj(src, dst)
    monkeypatch.setenv("FEDHET_DATA", str(tmp_path))
    from_root = load_dataset("fmnist")
    from_debian = load_dataset("fmnist", root=tmp_path / "empty")
    assert torch.equal(from_root.train_x, from_debian.train_x)
    assert torch.equal(from_root.test_y, from_debian.test_y)
    assert from_root.classes == from_debian.classes


def write_idx(path, array):
    header = bytes([0, 0, 8, array.ndim]) + np.array(array.shape, dtype=">i4").tobytes()
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def test_emnist_balanced_images_are_turned_upright(tmp_path):
    raw = tmp_path / "EMNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    stored = {}
    for split, n in (("train", 12), ("test", 5)):
        stored[split] = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        write_idx(raw / f"emnist-balanced-{split}-images-idx3-ubyte", stored[split])
        write_idx(raw / f"emnist-balanced-{split}-labels-idx1-ubyte", np.arange(n) % 47)
    ds = load_dataset("emnist", root=tmp_path)
    assert ds.num_classes == 47
    pixels = (denormalize(ds, ds.train_x) * 255).round()[:, 0]
    expected = torch.from_numpy(stored["train"]).transpose(1, 2).double()
    assert torch.equal(pixels, expected)
    assert ds.test_y.tolist() == list(range(5))


def test_missing_dataset_names_the_places_looked(tmp_path, monkeypatch):
    monkeypatch.setattr(torchvision, "DEBIAN_FASHION_MNIST", tmp_path / "no-debian")
    with pytest.raises(InputError) as err:
        load_dataset("fmnist", root=tmp_path / "explicit")
    message = str(err.value)
    assert "\n" not in message
    assert str(tmp_path / "explicit") in message and str(tmp_path / "no-debian") in message
    assert "FEDHET_DATA" in message and "download: true" in message
    assert "apt-get install dataset-fashion-mnist" in message

    monkeypatch.setenv("FEDHET_DATA", str(tmp_path / "from-env"))
    with pytest.raises(InputError, match="from-env"):
        load_dataset("cifar10")
    monkeypatch.delenv("FEDHET_DATA")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=str(tmp_path / "data")):
        load_dataset("mnist")


def test_unknown_dataset_is_an_input_error():
    with pytest.raises(InputError, match="imagenet"):
        load_dataset("imagenet")


def test_four_quarter_turns_are_exact():
    x = torch.randn(3, 2, 9, 9, generator=torch.Generator().manual_seed(0))
    turned = x
    for _ in range(4):
        turned = rotate(turned, 90, mean=(0.5, 0.2), std=(0.3, 0.1))
    assert torch.equal(turned, x)
    wide = torch.randn(2, 1, 5, 7, generator=torch.Generator().manual_seed(1))
    assert torch.equal(rotate(rotate(wide, 180), -180), wide)


def test_rotation_is_counter_clockwise_and_continuous():
    x = torch.zeros(1, 1, 6, 6)
    x[0, 0, 0, 5] = 1.0  # top right
    quarter = rotate(x, 90)
    assert quarter[0, 0, 0, 0] == 1.0 and quarter.sum() == 1.0  # now top left
    image = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    nearly = tvf.rotate(image, 89.999, interpolation=tvf.InterpolationMode.BILINEAR)
    assert torch.allclose(rotate(image, 90)[..., 1:-1, 1:-1], nearly[..., 1:-1, 1:-1], atol=1e-3)


def test_rotation_fills_with_a_black_pixel():
    mean, std = (0.5, 0.25, 0.1), (0.2, 0.4, 0.3)
    white = torch.ones(1, 3, 21, 21)
    normalized = (white - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    turned = rotate(normalized, 45, mean=mean, std=std)
    black = torch.tensor([-m / s for m, s in zip(mean, std, strict=True)])
    assert torch.allclose(turned[0, :, 0, 0], black, atol=1e-5)  # a corner the turn uncovers
    assert torch.allclose(turned[0, :, 10, 10], normalized[0, :, 10, 10])  # the centre stays
