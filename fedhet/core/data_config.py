"""The `data:` block of a dataset plug-in, and the arrays its loader returns.

A dataset plug-in (fedhet's own `arrays` and `synthetic` included) names, under the
`fedhet.datasets` entry-point group, a subclass of `DataConfig`: its spec block
(`dataset: Literal["name"]` and its own fields), `describe()` (the sample shape, classes and
natural clients, known without torch, so planning and `spec validate` stay light), and `loader`,
the "package.module:function" that returns its data, imported on first use:

    def load(config, seed: int) -> ArrayData

Randomness in a loader comes from `seed` (the spec's) only. The arrays are checked against the
description (`check_arrays`) and used as given, as float32 features: the image options
(`channels`, `resize`, `scale`) are fedhet's built-in image datasets' only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np
from pydantic import ValidationError, model_validator
from pydantic_core import PydanticCustomError

from fedhet.core.errors import InputError
from fedhet.core.spec import DataSpec


class DataInfo(NamedTuple):
    shape: tuple[int, int, int]  # one sample's (channels, height, width); a vector is (1, 1, D)
    classes: int
    train_samples: int | None = None  # None: known only once loaded
    clients: int | None = None  # the natural clients (`partition: {scheme: natural}`); None: none


class DataConfig(DataSpec):
    loader: ClassVar[str]  # "package.module:function", see the module docstring

    dataset: str

    def describe(self) -> DataInfo:
        raise NotImplementedError

    def identity(self) -> dict[str, Any]:
        """What enters the partition's key (hence every key built on it) besides the dataset's
        name: by default its own fields. A dataset read from a file gives the file's hash."""
        return self.model_dump(mode="json", exclude=set(DataSpec.model_fields))

    @model_validator(mode="after")
    def _used_as_given(self) -> DataConfig:
        for name in self.input_format():
            message = (
                f"applies to the built-in image datasets only; dataset {self.dataset} is used "
                "as given, so remove it"
            )
            raise refusal(name, message, getattr(self, name))
        return self


def refusal(field: str, message: str, value: Any) -> ValidationError:
    """A validation error of a data block's `field` (the spec places it: `data.<field>`)."""
    error = {"type": PydanticCustomError("spec", message), "loc": (field,), "input": value}
    return ValidationError.from_exception_data("Spec", [error])


@dataclass(frozen=True)
class ArrayData:
    """A dataset as arrays: what a dataset plug-in's loader returns."""

    train_x: np.ndarray  # (N, ...) real features, one sample of `DataInfo.shape`'s size each
    train_y: np.ndarray  # (N,) integer labels in [0, classes)
    test_x: np.ndarray
    test_y: np.ndarray
    train_client: np.ndarray | None = None  # (N,) integer client ids in [0, clients)


def sample_shape(features: tuple[int, ...]) -> tuple[int, int, int]:
    """(channels, height, width) of a sample of shape `features`: D, (H, W) or (C, H, W)."""
    padded = (1,) * (3 - len(features)) + tuple(features)
    if len(padded) != 3:
        raise ValueError(f"samples of shape {features}: give D, (H, W) or (C, H, W) features")
    return padded  # type: ignore[return-value]


def check_arrays(data: ArrayData, info: DataInfo, source: str) -> None:
    """InputError naming `source` unless `data` has the shapes, dtypes, labels and clients that
    `info` describes."""
    for split in ("train", "test"):
        x, y = getattr(data, f"{split}_x"), getattr(data, f"{split}_y")
        _check_features(x, info.shape, f"{source}: {split} features")
        _check_ids(y, len(x), info.classes, f"{source}: {split} labels", "classes")
    if (data.train_client is None) != (info.clients is None):
        has = "has no" if data.train_client is None else "has"
        raise InputError(f"{source}: the data {has} client ids, unlike its description")
    if data.train_client is not None:
        ids = f"{source}: client ids"
        _check_ids(data.train_client, len(data.train_x), info.clients, ids, "clients")


def _check_features(x: np.ndarray, shape: tuple[int, int, int], where: str) -> None:
    if not isinstance(x, np.ndarray) or x.dtype.kind not in "biuf":
        kind = getattr(x, "dtype", type(x).__name__)
        raise InputError(f"{where}: {kind} values; give a real-valued numeric array")
    if x.ndim < 2 or math.prod(x.shape[1:]) != math.prod(shape):
        raise InputError(
            f"{where}: shape {x.shape}; give one row per sample of {math.prod(shape)} values "
            f"(samples of shape {shape})"
        )
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise InputError(f"{where}: holds NaN or infinite values; remove or impute them")


def _check_ids(ids: np.ndarray, rows: int, count: int, where: str, what: str) -> None:
    if not isinstance(ids, np.ndarray) or ids.dtype.kind not in "iu" or ids.ndim != 1:
        kind = getattr(ids, "dtype", type(ids).__name__)
        raise InputError(f"{where}: {kind} array; give a 1-D integer array")
    if len(ids) != rows:
        raise InputError(f"{where}: {len(ids)} values for {rows} samples; give one per sample")
    if len(ids) and (ids.min() < 0 or ids.max() >= count):
        raise InputError(
            f"{where}: values {ids.min()}..{ids.max()} outside 0..{count - 1} "
            f"(the data's {count} {what})"
        )
