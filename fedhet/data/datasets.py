"""Dataset registry: every dataset loads as float32 tensors, held in memory.

The input format (the spec's `data.channels`, `data.resize`, `data.scale`; `load_data`) is
applied here, in this one place, so every stage sees the same tensors: pixels in [0, 1], resized
bilinearly, then standardized (scale standardize: per-channel mean 0 and std 1 over the
training set, the mean and population std computed exactly from the integer pixel values, or
from the resized images when resized) or left in [0, 1] (scale unit), then a grey channel
repeated (an expanded view: no copy). Loaded datasets are cached in-process; treat their
tensors as read-only.

Data root resolution: the explicit `root` argument, else the FEDHET_DATA environment
variable, else ./data. Fashion-MNIST is also read from the Debian package
dataset-fashion-mnist's folder when the data root does not hold it.
"""

from __future__ import annotations

import functools
import gzip
import importlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from fedhet.core.data_config import DataConfig, check_arrays
from fedhet.core.errors import InputError, RunError
from fedhet.core.spec import DataSpec
from fedhet.data.decoded import decoded
from fedhet.data.shapes import input_channels

DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
DIGITS_TEST_FRACTION = 0.2
FASHION_MNIST_CLASSES = (  # torchvision's FashionMNIST.classes
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip
_DIGITS_SPLIT_SEED = 20240601  # fixed: the digits split never depends on an experiment seed


@dataclass(frozen=True)
class Dataset:
    name: str
    train_x: torch.Tensor  # float32, N x C x H x W, normalized with mean/std (unit: 0 and 1)
    train_y: torch.Tensor  # int64
    test_x: torch.Tensor
    test_y: torch.Tensor
    classes: tuple[str, ...]
    mean: tuple[float, ...]  # per channel, in [0, 1] pixel units
    std: tuple[float, ...]
    train_client: np.ndarray | None = None  # a plug-in's client id per training sample
    test_client: np.ndarray | None = None  # a plug-in's client id per test sample (-1: none)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def shape(self) -> tuple[int, int, int]:
        c, h, w = self.train_x.shape[1:]
        return c, h, w


@dataclass(frozen=True)
class _Raw:
    """Integer pixels (uint8, N x C x H x W, values 0..max_value) and int64 labels."""

    train_pixels: torch.Tensor
    train_labels: torch.Tensor
    test_pixels: torch.Tensor
    test_labels: torch.Tensor
    classes: tuple[str, ...]
    max_value: int = 255


def dataset_names() -> list[str]:
    return sorted(_DATASET_NAMES)


Scale = Literal["standardize", "unit"]


def load_data(data: DataSpec, name: str | None = None, seed: int | None = None) -> Dataset:
    """The spec's dataset (or dataset `name`, e.g. a proxy) in the spec's input format; a
    plug-in's (fedhet.core.data_config) loaded for the spec's `seed`."""
    if isinstance(data, DataConfig) and name is None:
        if seed is None:
            raise RunError(f"data: dataset {data.dataset} is loaded for a seed; pass the spec's")
        return _load_plugin(data, json.dumps(data.keyed_identity(), sort_keys=True), seed)
    return load_dataset(
        name or data.dataset,
        data.root,
        data.download,
        channels=data.channels,
        resize=data.resize,
        scale=data.scale,
    )


def load_dataset(
    name: str,
    root: str | Path | None = None,
    download: bool = False,
    *,
    channels: int | None = None,
    resize: int | None = None,
    scale: Scale = "standardize",
) -> Dataset:
    """Load a dataset by name (see dataset_names()) in the given input format (see the module
    docstring); InputError if unknown or missing."""
    if name not in _DATASET_NAMES:
        raise InputError(f"data.dataset: unknown dataset {name!r}; choose one of {dataset_names()}")
    resolved, source = _resolve_root(root)
    return _load_cached(name, resolved, source, download, channels, resize, scale)


Interpolation = Literal["bilinear", "nearest"]


def rotate(
    x: torch.Tensor,
    degrees: float,
    mean: Sequence[float] = (0.0,),
    std: Sequence[float] = (1.0,),
    interpolation: Interpolation = "bilinear",
) -> torch.Tensor:
    """Rotate a batch (N x C x H x W) counter-clockwise by `degrees`, resampling by
    `interpolation`.

    `x` is taken to be normalized with `mean`/`std` (pass the dataset's); the corners the
    rotation uncovers are filled with a black (0) pixel in unnormalized space.
    """
    quarter_turns, remainder = divmod(degrees, 90)
    height, width = x.shape[-2:]
    if remainder == 0 and (height == width or quarter_turns % 2 == 0):
        # exact; interpolation would add rounding noise at multiples of 90 degrees
        return torch.rot90(x, int(quarter_turns) % 4, dims=(-2, -1))
    channels = x.shape[-3]
    means, stds = _per_channel(mean, channels), _per_channel(std, channels)
    fill = [-m / s for m, s in zip(means, stds, strict=True)]
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as tvf

    mode = InterpolationMode(interpolation)
    return tvf.rotate(x, float(degrees), interpolation=mode, fill=fill)


def _per_channel(values: Sequence[float], channels: int) -> list[float]:
    return list(values) * channels if len(values) == 1 else list(values)


# --- loading and normalization ------------------------------------------------------------


def _resolve_root(root: str | Path | None) -> tuple[Path, str]:
    if root is not None:
        return Path(root).expanduser().resolve(), "--data-root/data.root"
    if os.environ.get("FEDHET_DATA"):
        return Path(os.environ["FEDHET_DATA"]).expanduser().resolve(), "FEDHET_DATA"
    return Path("data").resolve(), "the default ./data"


@functools.lru_cache(maxsize=4)
def _load_cached(
    name: str,
    root: Path,
    root_source: str,
    download: bool,
    channels: int | None,
    resize: int | None,
    scale: Scale,
) -> Dataset:
    raw = _load_raw(name, root, root_source, download)
    wanted = input_channels(name, raw.train_pixels.shape[1], channels)
    train_x, test_x = _unit(raw.train_pixels, raw.max_value), _unit(raw.test_pixels, raw.max_value)
    if resize is not None:
        train_x, test_x = _resized(train_x, resize), _resized(test_x, resize)
    count = train_x.shape[1]
    mean, std = (0.0,) * count, (1.0,) * count
    if scale == "standardize":
        exact = resize is None  # the integer pixels' histogram describes the images exactly
        mean, std = _channel_stats(raw.train_pixels, raw.max_value) if exact else _stats(train_x)
        train_x, test_x = _standardize(train_x, mean, std), _standardize(test_x, mean, std)
    if wanted != count:
        train_x, test_x = _repeated(train_x, wanted), _repeated(test_x, wanted)
        mean, std = mean * wanted, std * wanted
    return Dataset(name, train_x, raw.train_labels, test_x, raw.test_labels, raw.classes, mean, std)


def _channel_stats(
    pixels: torch.Tensor, max_value: int
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Exact per-channel mean and population std, in [0, 1] units, from a value histogram."""
    values = torch.arange(max_value + 1, dtype=torch.float64) / max_value
    means, stds = [], []
    for channel in range(pixels.shape[1]):
        counts = torch.bincount(pixels[:, channel].reshape(-1), minlength=max_value + 1).double()
        probs = counts / counts.sum()
        mean = float((probs * values).sum())
        var = float((probs * (values - mean) ** 2).sum())
        means.append(mean)
        stds.append(max(var, 1e-12) ** 0.5)
    return tuple(means), tuple(stds)


def _stats(x: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and population std of float images (N x C x H x W)."""
    x64 = x.double()
    means = x64.mean(dim=(0, 2, 3))
    stds = x64.var(dim=(0, 2, 3), correction=0).clamp_min(1e-12).sqrt()
    return tuple(means.tolist()), tuple(stds.tolist())


def _unit(pixels: torch.Tensor, max_value: int) -> torch.Tensor:
    return pixels.to(torch.float32).div_(max_value)


def _resized(x: torch.Tensor, side: int) -> torch.Tensor:
    if x.shape[-2:] == (side, side):
        return x
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as tvf

    return tvf.resize(x, [side, side], interpolation=InterpolationMode.BILINEAR, antialias=True)


def _standardize(x: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    x.sub_(torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
    return x.div_(torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))


def _repeated(x: torch.Tensor, channels: int) -> torch.Tensor:
    """A grey batch seen as `channels` equal channels; a view, so no memory is copied."""
    return x.expand(-1, channels, -1, -1)


# --- sources --------------------------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def _load_plugin(data: DataConfig, identity: str, seed: int) -> Dataset:
    """A dataset plug-in's arrays as float32 tensors, used as given; cached by `identity` too,
    so a changed file is read again."""
    module, _, function = data.loader.partition(":")
    try:
        loader = getattr(importlib.import_module(module), function)
    except Exception as err:  # a plug-in's code failing to import is the plug-in's failure
        raise RunError(f"data: dataset {data.dataset}: cannot import {data.loader}: {err}") from err
    arrays, info = loader(data, seed), data.describe()
    check_arrays(arrays, info, f"data: dataset {data.dataset}")
    channels = info.shape[0]

    def features(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(x, np.float32).reshape(len(x), *info.shape))

    def labels(y: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(y.astype(np.int64))

    return Dataset(
        data.dataset,
        features(arrays.train_x),
        labels(arrays.train_y),
        features(arrays.test_x),
        labels(arrays.test_y),
        tuple(str(c) for c in range(info.classes)),
        (0.0,) * channels,
        (1.0,) * channels,
        arrays.train_client,
        arrays.test_client,
    )


def _load_digits() -> _Raw:
    """scikit-learn's bundled 8x8 digits with a fixed stratified 80/20 train/test split."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    pixels = torch.from_numpy(bunch.images.astype(np.uint8)).unsqueeze(1)  # values 0..16
    labels = torch.from_numpy(bunch.target.astype(np.int64))
    test_mask = _stratified_test_mask(bunch.target, DIGITS_TEST_FRACTION, _DIGITS_SPLIT_SEED)
    train, test = torch.from_numpy(~test_mask), torch.from_numpy(test_mask)
    return _Raw(
        pixels[train],
        labels[train],
        pixels[test],
        labels[test],
        classes=tuple(str(c) for c in bunch.target_names),
        max_value=16,
    )


def _stratified_test_mask(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mask = np.zeros(len(labels), dtype=bool)
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        mask[members[: round(fraction * len(members))]] = True
    return mask


@dataclass(frozen=True)
class _TorchvisionSource:
    make: Callable[[Path, bool, bool], object]  # (root, train, download) -> dataset
    folder: str  # where torchvision keeps the files under the data root
    classes: tuple[str, ...] | None = None  # for datasets without a .classes attribute


def _tv():
    """torchvision's datasets, imported when a dataset is read through them (importing
    torchvision costs about a second, which a run on Debian's Fashion-MNIST never needs)."""
    from torchvision import datasets

    return datasets


_TORCHVISION = {
    "mnist": _TorchvisionSource(lambda r, t, d: _tv().MNIST(r, train=t, download=d), "MNIST/raw"),
    "fmnist": _TorchvisionSource(
        lambda r, t, d: _tv().FashionMNIST(r, train=t, download=d), "FashionMNIST/raw"
    ),
    "emnist": _TorchvisionSource(
        lambda r, t, d: _tv().EMNIST(r, split="balanced", train=t, download=d), "EMNIST/raw"
    ),
    "cifar10": _TorchvisionSource(
        lambda r, t, d: _tv().CIFAR10(r, train=t, download=d), "cifar-10-batches-py"
    ),
    "cifar100": _TorchvisionSource(
        lambda r, t, d: _tv().CIFAR100(r, train=t, download=d), "cifar-100-python"
    ),
    "svhn": _TorchvisionSource(
        lambda r, t, d: _tv().SVHN(r, split="train" if t else "test", download=d),
        "train_32x32.mat",
        classes=tuple(str(digit) for digit in range(10)),
    ),
}


def _read_torchvision(name: str, root: Path, download: bool) -> _Raw:
    """Raises RuntimeError (torchvision's) when the files are missing."""
    source = _TORCHVISION[name]
    if not download and not (root / source.folder).exists():
        raise RuntimeError(f"{root / source.folder} does not exist")
    train, test = source.make(root, True, download), source.make(root, False, download)
    train_pixels, train_labels = _arrays(train)
    test_pixels, test_labels = _arrays(test)
    classes = source.classes or tuple(train.classes)  # type: ignore[attr-defined]
    return _Raw(train_pixels, train_labels, test_pixels, test_labels, classes)


def _arrays(ds: object) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 N x C x H x W pixels, int64 labels) straight from a torchvision dataset's arrays."""
    tv = _tv()
    data = ds.data  # type: ignore[attr-defined]
    if isinstance(ds, tv.SVHN):  # numpy, N x C x H x W view
        labels = torch.from_numpy(ds.labels.astype(np.int64))
        return torch.from_numpy(np.ascontiguousarray(data)), labels
    if isinstance(ds, tv.CIFAR10):  # numpy N x H x W x C (CIFAR100 subclasses CIFAR10)
        pixels = torch.from_numpy(data).permute(0, 3, 1, 2).contiguous()
        return pixels, torch.tensor(ds.targets, dtype=torch.int64)
    if isinstance(ds, tv.EMNIST):  # stored transposed; flip back so characters are upright
        data = data.transpose(1, 2).contiguous()
    return data.unsqueeze(1), ds.targets.to(torch.int64)  # type: ignore[attr-defined]


_DEBIAN_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)


def _debian_fashion_mnist_present() -> bool:
    return all((DEBIAN_FASHION_MNIST / file).is_file() for file in _DEBIAN_FILES)


def _read_debian_fashion_mnist() -> _Raw:
    """Debian's dataset-fashion-mnist: the original gzipped IDX files in one folder."""
    arrays = [decoded(DEBIAN_FASHION_MNIST / file, _read_idx_gz) for file in _DEBIAN_FILES]
    train_x, train_y, test_x, test_y = arrays
    return _Raw(
        torch.from_numpy(train_x).unsqueeze(1),
        torch.from_numpy(train_y.astype(np.int64)),
        torch.from_numpy(test_x).unsqueeze(1),
        torch.from_numpy(test_y.astype(np.int64)),
        classes=FASHION_MNIST_CLASSES,
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


def _load_raw(name: str, root: Path, root_source: str, download: bool) -> _Raw:
    if name == "digits":
        return _load_digits()
    try:
        return _read_torchvision(name, root, download=False)
    except RuntimeError:
        pass
    if name == "fmnist" and _debian_fashion_mnist_present():
        return _read_debian_fashion_mnist()
    if not download:
        raise InputError(_missing_message(name, root, root_source))
    try:
        return _read_torchvision(name, root, download=True)
    except (RuntimeError, OSError) as err:
        raise RunError(f"data: downloading {name} into {root} failed: {err}") from None


def _missing_message(name: str, root: Path, root_source: str) -> str:
    looked = f"{root / _TORCHVISION[name].folder} (data root from {root_source})"
    fix = "pass --data-root DIR or set FEDHET_DATA to a folder holding it"
    fix += ", or set data: {download: true}"
    if name == "fmnist":
        looked += f" and {DEBIAN_FASHION_MNIST}"
        fix += ", or apt-get install dataset-fashion-mnist"
    return f"data.dataset: {name} not found; looked in {looked}; {fix}"


_DATASET_NAMES = ("digits", *_TORCHVISION)
