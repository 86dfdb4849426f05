"""The datasets read through torchvision's dataset classes from a data root: `mnist`, `fmnist`,
`emnist` (its balanced split), `cifar10`, `cifar100` and `svhn`.

    data: {dataset: fmnist}                  # root and download optional

They are downloaded only when the spec asks (`data: {download: true}`). Fashion-MNIST is also
read from the Debian package dataset-fashion-mnist's folder when the data root does not hold
it. torchvision is imported only when a dataset is read through it (about a second, which a run
on Debian's Fashion-MNIST never needs).
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from fedhet.core.errors import InputError, RunError
from fedhet.core.image_data import DataRoot, ImageDataConfig, Pixels
from fedhet.data.decoded import decoded

DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = (  # torchvision's FashionMNIST.classes
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip
_DEBIAN_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)


def _tv() -> Any:
    from torchvision import datasets

    return datasets


class TorchvisionData(ImageDataConfig):
    """A dataset of torchvision's grey 28x28 layout (MNIST's): a subclass names its class."""

    loader: ClassVar[str] = "fedhet.data.torchvision_sets:read"
    source: ClassVar[str]  # the torchvision.datasets class
    folder: ClassVar[str]  # where torchvision keeps its files under the data root
    shape = (1, 28, 28)

    def open(self, root: Path, train: bool, download: bool) -> Any:
        return getattr(_tv(), self.source)(root, train=train, download=download)

    def arrays(self, ds: Any) -> tuple[np.ndarray, np.ndarray]:
        """(uint8 N x C x H x W pixels, int64 labels) straight from the torchvision dataset."""
        return ds.data.numpy()[:, None], ds.targets.numpy().astype(np.int64)

    def class_names(self, ds: Any) -> tuple[str, ...]:
        return tuple(ds.classes)

    def installed(self) -> Pixels | None:
        """The dataset from a system package when the data root lacks it; None if none has it."""
        return None

    def missing(self, root: DataRoot, places: str = "", fixes: str = "") -> str:
        """The one line saying where the dataset was looked for (the data root, and `places`)
        and how to provide it (`fixes` added)."""
        looked = f"{root.path / self.folder} (data root from {root.source}){places}"
        fix = "pass --data-root DIR or set FEDHET_DATA to a folder holding it"
        fix += ", or set data: {download: true}" + fixes
        return f"data.dataset: {self.dataset} not found; looked in {looked}; {fix}"


class MnistData(TorchvisionData):
    source, folder = "MNIST", "MNIST/raw"
    classes, train_samples = 10, 60_000

    dataset: Literal["mnist"] = "mnist"


class FashionMnistData(TorchvisionData):
    source, folder = "FashionMNIST", "FashionMNIST/raw"
    classes, train_samples = 10, 60_000  # MNIST's: a drop-in replacement for it

    dataset: Literal["fmnist"] = "fmnist"

    def installed(self) -> Pixels | None:
        return read_debian_fashion_mnist() if debian_fashion_mnist_present() else None

    def missing(self, root: DataRoot, places: str = "", fixes: str = "") -> str:
        places += f" and {DEBIAN_FASHION_MNIST}"
        return super().missing(root, places, fixes + ", or apt-get install dataset-fashion-mnist")


class EmnistData(TorchvisionData):
    source, folder = "EMNIST", "EMNIST/raw"
    classes, train_samples = 47, 112_800  # the balanced split

    dataset: Literal["emnist"] = "emnist"

    def open(self, root: Path, train: bool, download: bool) -> Any:
        return _tv().EMNIST(root, split="balanced", train=train, download=download)

    def arrays(self, ds: Any) -> tuple[np.ndarray, np.ndarray]:
        pixels, labels = super().arrays(ds)  # stored transposed: flip back, characters upright
        return np.ascontiguousarray(pixels.transpose(0, 1, 3, 2)), labels


class _CifarData(TorchvisionData):
    """CIFAR-10 and CIFAR-100: 50,000 training images of 32x32 colour, the same layout."""

    shape, train_samples = (3, 32, 32), 50_000

    def arrays(self, ds: Any) -> tuple[np.ndarray, np.ndarray]:  # numpy N x H x W x C
        pixels = np.ascontiguousarray(ds.data.transpose(0, 3, 1, 2))
        return pixels, np.asarray(ds.targets, dtype=np.int64)


class Cifar10Data(_CifarData):
    source, folder = "CIFAR10", "cifar-10-batches-py"
    classes = 10

    dataset: Literal["cifar10"] = "cifar10"


class Cifar100Data(_CifarData):
    source, folder = "CIFAR100", "cifar-100-python"
    classes = 100

    dataset: Literal["cifar100"] = "cifar100"


class SvhnData(TorchvisionData):
    source, folder = "SVHN", "train_32x32.mat"
    shape, classes, train_samples = (3, 32, 32), 10, 73_257

    dataset: Literal["svhn"] = "svhn"

    def open(self, root: Path, train: bool, download: bool) -> Any:
        return _tv().SVHN(root, split="train" if train else "test", download=download)

    def arrays(self, ds: Any) -> tuple[np.ndarray, np.ndarray]:  # numpy, N x C x H x W
        return np.ascontiguousarray(ds.data), ds.labels.astype(np.int64)

    def class_names(self, ds: Any) -> tuple[str, ...]:
        return tuple(str(digit) for digit in range(10))  # SVHN has no .classes


def read(config: TorchvisionData, root: DataRoot) -> Pixels:
    """The dataset from the data root, else from a system package, else downloaded when the
    spec asks; InputError naming the places looked otherwise."""
    try:
        return _read(config, root.path, download=False)
    except RuntimeError:
        pass
    installed = config.installed()
    if installed is not None:
        return installed
    if not config.download:
        raise InputError(config.missing(root))
    try:
        return _read(config, root.path, download=True)
    except (RuntimeError, OSError) as err:
        raise RunError(
            f"data: downloading {config.dataset} into {root.path} failed: {err}"
        ) from None


def _read(config: TorchvisionData, root: Path, download: bool) -> Pixels:
    """Raises RuntimeError (torchvision's) when the files are missing."""
    if not download and not (root / config.folder).exists():
        raise RuntimeError(f"{root / config.folder} does not exist")
    train, test = config.open(root, True, download), config.open(root, False, download)
    train_pixels, train_labels = config.arrays(train)
    test_pixels, test_labels = config.arrays(test)
    return Pixels(train_pixels, train_labels, test_pixels, test_labels, config.class_names(train))


def debian_fashion_mnist_present() -> bool:
    return all((DEBIAN_FASHION_MNIST / file).is_file() for file in _DEBIAN_FILES)


def read_debian_fashion_mnist() -> Pixels:
    """Debian's dataset-fashion-mnist: the original gzipped IDX files in one folder."""
    arrays = [decoded(DEBIAN_FASHION_MNIST / file, _read_idx_gz) for file in _DEBIAN_FILES]
    train_x, train_y, test_x, test_y = arrays
    return Pixels(
        train_x[:, None],
        train_y.astype(np.int64),
        test_x[:, None],
        test_y.astype(np.int64),
        class_names=FASHION_MNIST_CLASSES,
    )


def _read_idx_gz(path: Path) -> np.ndarray:
    """IDX: 2 zero bytes, type byte (0x08 = uint8), ndim, ndim big-endian int32 dims, data."""
    with gzip.open(path, "rb") as f:
        buffer = bytearray(f.read())
    if buffer[:3] != b"\x00\x00\x08":
        raise RunError(f"{path}: not a uint8 IDX file; reinstall dataset-fashion-mnist")
    ndim = buffer[3]
    dims = np.frombuffer(buffer, dtype=">i4", count=ndim, offset=4)
    return np.frombuffer(buffer, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)
