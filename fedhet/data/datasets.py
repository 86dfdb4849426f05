"""Loading a spec's dataset: every dataset, fedhet's own and a plug-in's, is one config class of
the registry (`fedhet.core.spec.dataset_configs`, the `fedhet.datasets` entry points) that
knows its shape, classes, size and loader; here each loads as float32 tensors, held in memory.

fedhet's image datasets (fedhet.core.image_data: digits, the torchvision ones) are read as
integer pixels and put in the spec's input format (fedhet.data.image_format); a plug-in's
arrays (fedhet.core.data_config) are used as given. Loaded datasets are cached in-process;
treat their tensors as read-only.

Data root resolution: the explicit `root` argument, else the FEDHET_DATA environment
variable, else ./data.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import ValidationError

from fedhet.core.data_config import DataConfig, check_arrays
from fedhet.core.errors import InputError, RunError
from fedhet.core.image_data import DataRoot, ImageDataConfig
from fedhet.core.spec import DataSpec, dataset_configs
from fedhet.data.image_format import Scale, formatted


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


def dataset_names() -> list[str]:
    """The datasets that load by name alone (`load_dataset`): fedhet's image datasets."""
    return [name for name, config in dataset_configs().items() if config.by_name]


def load_data(data: DataSpec, name: str | None = None, seed: int | None = None) -> Dataset:
    """The spec's dataset (or dataset `name`, e.g. a proxy) in the spec's input format; a
    plug-in's (fedhet.core.data_config) loaded for the spec's `seed`."""
    if name is None and not data.by_name:
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
    """Load a dataset by name (see dataset_names()) in the given input format (see
    fedhet.data.image_format); InputError if unknown or missing."""
    if name not in dataset_names():
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


# --- loading ------------------------------------------------------------------------------


def _resolve_root(root: str | Path | None) -> tuple[Path, str]:
    if root is not None:
        return Path(root).expanduser().resolve(), "--data-root/data.root"
    if os.environ.get("FEDHET_DATA"):
        return Path(os.environ["FEDHET_DATA"]).expanduser().resolve(), "FEDHET_DATA"
    return Path("data").resolve(), "the default ./data"


def _loader(config: DataConfig) -> Callable[..., Any]:
    """The function its `loader` names, imported now; a plug-in's failing import is its own."""
    module, _, function = config.loader.partition(":")
    try:
        return getattr(importlib.import_module(module), function)
    except Exception as err:
        raise RunError(
            f"data: dataset {config.dataset}: cannot import {config.loader}: {err}"
        ) from err


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
    try:
        config = dataset_configs()[name](
            download=download, channels=channels, resize=resize, scale=scale
        )
    except ValidationError as err:  # an input format this dataset cannot take (FedBR's proxy)
        problem = err.errors()[0]
        raise InputError(f"data.{problem['loc'][0]}: {problem['msg']}") from None
    assert isinstance(config, ImageDataConfig), f"{name} is no image dataset"
    pixels = _loader(config)(config, DataRoot(root, root_source))
    images = formatted(pixels, channels, resize, scale)
    train_y, test_y = torch.from_numpy(pixels.train_labels), torch.from_numpy(pixels.test_labels)
    return Dataset(
        name,
        images.train_x,
        train_y,
        images.test_x,
        test_y,
        pixels.class_names,
        images.mean,
        images.std,
    )


@functools.lru_cache(maxsize=2)
def _load_plugin(data: DataConfig, identity: str, seed: int) -> Dataset:
    """A dataset plug-in's arrays as float32 tensors, used as given; cached by `identity` too,
    so a changed file is read again."""
    arrays, info = _loader(data)(data, seed), data.describe()
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
