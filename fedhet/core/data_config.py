"""The `data:` block of a dataset, and the arrays its loader returns.

Every dataset, fedhet's own and a plug-in's, names under the `fedhet.datasets` entry-point group
a subclass of `DataConfig`: its spec block (`dataset: Literal["name"]` and its own fields),
`describe()` (the sample shape, classes, training samples and natural clients, known without
torch, so planning and `spec validate` stay light), and `loader`, the "package.module:function"
that returns its data, imported on first use. fedhet's image datasets are `ImageDataConfig`s
(fedhet.core.image_data), whose loader reads pixels; every other dataset's returns arrays:

    def load(config, seed: int) -> ArrayData

Randomness in a loader comes from `seed` (the spec's) only. The arrays are checked against the
description (`check_arrays`) and used as given, as float32 features: the image options
(`channels`, `resize`, `scale`) are fedhet's built-in image datasets' only.

`identity()` (e.g. a file's content hash) enters the keys. A config keeps the first identity it
computes, the one its runs were planned with (`keyed_identity`), and loading refuses data whose
identity differs: a file replaced while fedhet runs stops the run in one line naming the file
instead of storing a result under a key that names other data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np
from pydantic import PrivateAttr, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from fedhet.core.errors import InputError
from fedhet.core.spec import DataSpec


class DataInfo(NamedTuple):
    shape: tuple[int, int, int]  # one sample's (channels, height, width); a vector is (1, 1, D)
    classes: int
    train_samples: int | None = None  # None: known only once loaded
    clients: int | None = None  # the natural clients (`partition: {scheme: natural}`); None: none
    tokens: bool = False  # samples are token ids (text), not real-valued features
    client_tests: bool = (
        False  # the test split names each sample's client (`ArrayData.test_client`)
    )


class DataConfig(DataSpec):
    loader: ClassVar[str]  # "package.module:function", see the module docstring
    # identity() entries that hash a file's (or folder's) content -> the field naming that file
    hashed_files: ClassVar[dict[str, str]] = {}

    dataset: str
    _keyed: dict[str, dict[str, Any]] = PrivateAttr(default_factory=dict)

    def describe(self) -> DataInfo:
        raise NotImplementedError

    def identity(self) -> dict[str, Any] | None:
        """What enters the partition's key (hence every key built on it) besides the dataset's
        name: by default its own fields. A dataset read from a file gives the file's hash; one
        that its name alone says (fedhet.core.image_data), None: nothing."""
        return self.model_dump(mode="json", exclude=set(DataSpec.model_fields))

    def keyed_identity(self, found: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The identity the keys name: the first this config computed (when its runs were
        planned). `found` (default: `identity()` now), the identity of the data at hand, must
        equal it: InputError naming the file that changed otherwise."""
        found = self.identity() if found is None else found
        keyed = self._keyed.setdefault("identity", found)
        if found != keyed:
            raise InputError(self._changed(keyed, found))
        return keyed

    def adopt_identity(self, keyed: dict[str, Any]) -> None:
        """Take `keyed` as the identity the keys name (runs planned in another process);
        InputError naming the file when the data here differ."""
        self._keyed.setdefault("identity", keyed)
        self.keyed_identity()

    def _changed(self, keyed: dict[str, Any], found: dict[str, Any]) -> str:
        entry = next(e for e in sorted(keyed.keys() | found.keys()) if keyed.get(e) != found.get(e))
        field = self.hashed_files.get(entry)
        what = f"data.{field}: {getattr(self, field)}" if field else f"data ({self.dataset})"
        then, now = (str(identity.get(entry))[:12] for identity in (keyed, found))
        return (
            f"{what} changed while fedhet was using it ({entry} {then} when its runs were "
            f"planned, {now} now), so no run was stored on it; leave it unchanged while fedhet "
            "runs and run the command again"
        )

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
    test_client: np.ndarray | None = None  # (N_test,) client ids in [-1, clients); -1: none's


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
    if (data.test_client is None) == info.client_tests:
        has = "has no" if data.test_client is None else "has"
        raise InputError(f"{source}: the test split {has} client ids, unlike its description")
    if data.test_client is not None:  # -1: a test sample of no training client
        ids, shifted = f"{source}: test client ids", data.test_client + 1
        _check_ids(shifted, len(data.test_x), (info.clients or 0) + 1, ids, "clients and -1")


def _check_features(x: np.ndarray, shape: tuple[int, int, int], where: str) -> None:
    if not isinstance(x, np.ndarray) or x.dtype.kind not in "biuf":
        kind = getattr(x, "dtype", type(x).__name__)
        raise InputError(f"{where}: {kind} values; give a real-valued numeric array")
    if x.ndim < 2 or math.prod(x.shape[1:]) != math.prod(shape):
        raise InputError(
            f"{where}: shape {x.shape}; give one row per sample of {math.prod(shape)} values "
            f"(samples of shape {shape})"
        )
    problem = feature_problem(x)
    if problem is not None:
        raise InputError(f"{where}: {problem}")


FLOAT32_MAX = float(np.finfo(np.float32).max)


def feature_problem(x: np.ndarray) -> str | None:
    """What keeps real-valued features `x` from training as float32 (NaN, infinite values, or
    values past float32's range); None when nothing does."""
    if x.dtype.kind != "f":
        return None  # integers up to int64's range are finite in float32
    if not np.isfinite(x).all():
        return "holds NaN or infinite values; remove or impute them"
    peak = float(max(x.max(), -x.min())) if x.size else 0.0
    if peak > FLOAT32_MAX:  # finite in float64, infinite once trained in float32
        return (
            f"holds values up to {peak:.3g} in magnitude, past float32's range "
            f"({FLOAT32_MAX:.3g}), the dtype fedhet trains in; rescale them"
        )
    return None


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
