"""The `huggingface` dataset: a Hugging Face dataset read through the `datasets` library.

    data: {dataset: huggingface, path: my_saved_dataset}       # save_to_disk's folder
    data: {dataset: huggingface, path: parquet_folder, input: pixels, label: digit}
    data: {dataset: huggingface, path: ylecun/mnist}           # from the local cache
    partition: {scheme: natural, by: writer}                   # one client per writer
    partition: {scheme: natural, by: writer, group: 10}        # ten writers a client

`path` is a folder written by `save_to_disk`, a folder of Parquet or Arrow files, or a hub
name found in the local Hugging Face cache (fedhet.data.huggingface_read; nothing is fetched
unless `download: true`). The splits `split` (default train) and `test_split` (default test)
train and test. The input column (`input`; default the first of image, img, x) is an image
column, read as pixels in [0, 1] (grey when every image is, else RGB; one size), or a numeric
column (numbers, lists or arrays of them: a vector, H x W or C x H x W features, used as given);
the label column (`label`; default the first of label, y, labels) holds integers or class labels
(ClassLabel: its classes; else the largest label + 1). A text column, or one of another type,
is refused in one line. With `partition: {scheme: natural, by: COLUMN}`, the distinct values of
COLUMN in the training split, sorted, are clients 0..K-1; a test split with that column gives
each client its own test samples (`eval: {client_test: {}}`), a value no training sample has
being scored globally only.

The key's identity: the content hash of the files read, the splits, the columns (as resolved)
and `by`; a changed byte recomputes, a moved folder does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, PrivateAttr, model_validator

from fedhet.core.data_config import ArrayData, DataConfig, DataInfo, refusal, sample_shape
from fedhet.core.errors import InputError
from fedhet.core.sections import MAX_CLASSES
from fedhet.data import huggingface_read
from fedhet.data.huggingface_read import FieldError

INPUT_NAMES = ("image", "img", "x")
LABEL_NAMES = ("label", "y", "labels")


class HuggingFaceData(DataConfig):
    loader: ClassVar[str] = "fedhet.data.huggingface:load"
    hashed_files: ClassVar[dict[str, str]] = {"sha256": "path"}

    dataset: Literal["huggingface"] = "huggingface"
    path: str = Field(
        description="a save_to_disk folder, a folder of Parquet or Arrow files (relative to "
        "the working directory), or a hub name in the local Hugging Face cache"
    )
    download: bool = Field(
        False, description="let the datasets library fetch a hub name; not part of any key"
    )
    split: str = Field("train", min_length=1, description="the training split")
    test_split: str = Field("test", min_length=1, description="the test split")
    input: str | None = Field(
        None, min_length=1, description="the input column; default: image, img or x"
    )
    label: str | None = Field(
        None, min_length=1, description="the label column; default: label, y or labels"
    )
    _by: str | None = PrivateAttr(None)  # the client ids' column (partition.by)

    @model_validator(mode="after")
    def _readable(self) -> HuggingFaceData:
        try:
            self.summary()
        except FieldError as err:
            raise refusal(err.field, err.message, getattr(self, err.field)) from None
        return self

    def with_clients_from(self, column: str) -> HuggingFaceData:
        """This data with its client ids the values of `column` (`partition.by`); InputError
        when the training split has no such column, or one fedhet cannot take ids from."""
        train = self.splits()[0]
        if column not in train.column_names:
            raise InputError(_no_column(column, self.split, train.column_names))
        kind = huggingface_read.column_kind(train, column)
        if kind not in ("integer", "text"):
            raise InputError(f"column {column!r} is {kind}; give a column of integers or strings")
        copy = self.model_copy()
        copy._by, copy._keyed = column, {}
        return copy

    def splits(self) -> tuple[Any, Any]:
        """The training and test splits (`datasets.Dataset`s)."""
        read = huggingface_read.open_split
        train = read(self.path, self.split, "split", self.download)
        return train, read(self.path, self.test_split, "test_split", self.download)

    def summary(self) -> Summary:
        """What describe() and identity() say, read once per content and options."""
        train, test = self.splits()
        sha256 = huggingface_read.content_hash(self.path, [train, test])
        options = (self.split, self.test_split, self.input, self.label, self._by)
        return _summary(self.path, self.download, options, sha256)

    def describe(self) -> DataInfo:
        found = self.summary()
        clients = None if self._by is None else found.clients
        shape, classes, samples = found.shape, found.classes, found.train_samples
        return DataInfo(shape, classes, samples, clients, client_tests=found.own_tests)

    def identity(self) -> dict[str, Any]:
        found = self.summary()
        identity = {"sha256": found.sha256, "split": self.split, "test_split": self.test_split}
        identity |= {"input": found.input, "label": found.label}
        return identity | ({} if self._by is None else {"by": self._by})


@dataclass(frozen=True)
class Summary:
    sha256: str
    input: str  # the columns, resolved
    label: str
    shape: tuple[int, int, int]
    classes: int
    train_samples: int
    clients: int | None  # the distinct values of `by`
    own_tests: bool  # the test split has the `by` column


@lru_cache(maxsize=8)
def _summary(path: str, download: bool, options: tuple, sha256: str) -> Summary:
    split, test_split, given_input, given_label, by = options
    train = huggingface_read.open_split(path, split, "split", download)
    test = huggingface_read.open_split(path, test_split, "test_split", download)
    input_column = _column(train, given_input, INPUT_NAMES, "input", split)
    label = _column(train, given_label, LABEL_NAMES, "label", split)
    for field, column in (("input", input_column), ("label", label)):
        if column not in test.column_names:
            raise FieldError(
                "test_split",
                f"split {test_split} has no column {column!r}, the {field} column of split "
                f"{split} (its columns: {', '.join(test.column_names)}); add it there",
            )
    _check_input(train, input_column)
    if not len(train):
        raise FieldError("split", f"split {split} of {path} holds no samples")
    where = f"data.path: {path}"
    first = huggingface_read.column_values(train.select([0]), input_column, where)
    classes = _classes(train, test, label)
    ids = None if by is None else huggingface_read.column_values(train, by, where)
    clients = None if ids is None else len(np.unique(ids))
    own_tests = by is not None and by in test.column_names
    shape = sample_shape(first.shape[1:])
    return Summary(sha256, input_column, label, shape, classes, len(train), clients, own_tests)


def _column(part: Any, given: str | None, names: tuple[str, ...], field: str, split: str) -> str:
    columns = part.column_names
    if given is not None and given not in columns:
        raise FieldError(field, _no_column(given, split, columns))
    found = given or next((name for name in names if name in columns), None)
    if found is None:
        raise FieldError(
            field,
            f"none of the columns {', '.join(names)} in split {split} (its columns: "
            f"{', '.join(columns)}); name the {field} column with data.{field}",
        )
    return found


def _no_column(column: str, split: str, columns: list[str]) -> str:
    return f"no column {column!r} in split {split} (its columns: {', '.join(columns)}); name one"


def _check_input(part: Any, column: str) -> None:
    kind = huggingface_read.column_kind(part, column)
    if kind == "text":
        raise FieldError(
            "input",
            f"column {column!r} holds text, which this dataset does not read; give an image or "
            "numeric column (text tasks: dataset leaf)",
        )
    if kind not in ("image", "array", "integer"):
        raise FieldError(
            "input",
            f"column {column!r} is {kind}, which fedhet does not read; give an image "
            "or numeric column",
        )


def _classes(train: Any, test: Any, column: str) -> int:
    kind = huggingface_read.column_kind(train, column)
    if kind != "integer":
        what = "text" if kind == "text" else kind
        raise FieldError(
            "label",
            f"column {column!r} holds {what}; give integer labels or a ClassLabel column "
            "(Dataset.class_encode_column)",
        )
    labels = [huggingface_read.column_values(part, column, column) for part in (train, test)]
    lowest = min(int(y.min()) for y in labels if len(y))
    if lowest < 0:
        raise FieldError("label", f"column {column!r} holds label {lowest}; number classes from 0")
    named = getattr(train.features[column], "num_classes", None)
    classes = named or 1 + max(int(y.max()) for y in labels if len(y))
    if classes > MAX_CLASSES:
        raise FieldError("label", f"{classes:,} classes, past fedhet's limit of {MAX_CLASSES:,}")
    return classes


def load(config: HuggingFaceData, seed: int) -> ArrayData:
    """The splits' columns as arrays (see the module docstring): those of the content the keys
    name, else InputError naming the path that changed."""
    found = config.summary()
    config.keyed_identity()
    train, test = config.splits()
    where = f"data.path: {config.path}"
    arrays = []
    for part in (train, test):
        x = huggingface_read.column_values(part, found.input, where)
        arrays += [x.reshape(len(x), -1) if x.ndim == 1 else x]  # a number: one feature
        arrays += [huggingface_read.column_values(part, found.label, where)]
    train_client = test_client = None
    if config._by is not None:
        ids = [huggingface_read.column_values(part, config._by, where) for part in (train, test)]
        values = np.unique(ids[0])
        train_client = np.searchsorted(values, ids[0]).astype(np.int64)
        if found.own_tests:
            test_client = _ids(values, ids[1])
    return ArrayData(*arrays, train_client, test_client)


def _ids(values: np.ndarray, column: np.ndarray) -> np.ndarray:
    """Each entry's index among the sorted distinct `values`; -1 for one not among them."""
    at = np.searchsorted(values, column).clip(0, max(len(values) - 1, 0))
    known = len(values) > 0 and values[at] == column
    return np.where(known, at, -1).astype(np.int64)
