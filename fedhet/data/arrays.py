"""The `arrays` dataset: a user's own data from a `.npz` or Parquet file
(fedhet.data.array_files says what each holds).

    data: {dataset: arrays, path: mine.npz}

The test split is another file of the same layout (`test: mine_test.npz`; its client ids are
not used) or, without one, `test_fraction` of each client's samples of each class (rounded
half up, fedhet.data.validation), held out by a fixed generator: every experiment seed tests
on the same samples. Client ids, sorted, become clients 0..K-1 (`partition: {scheme:
natural}`). The files' content hashes, not their paths, enter the keys: a changed file
recomputes, a moved one does not; a file changed while fedhet runs is refused when loaded
(`DataConfig.keyed_identity`). Labels make at most MAX_CLASSES classes.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from fedhet.core.data_config import ArrayData, DataConfig, DataInfo, refusal, sample_shape
from fedhet.core.errors import InputError
from fedhet.core.rng import numpy_rng
from fedhet.core.sections import MAX_CLASSES
from fedhet.data.array_files import ArrayFile, read_file
from fedhet.data.validation import split_client

_SPLIT_SEED = 20250101  # fixed: the held-out test split never depends on an experiment seed


class ArraysData(DataConfig):
    loader: ClassVar[str] = "fedhet.data.arrays:load"
    hashed_files: ClassVar[dict[str, str]] = {"sha256": "path", "test_sha256": "test"}

    dataset: Literal["arrays"] = "arrays"
    path: str = Field(description="a .npz or .parquet file, relative to the working directory")
    test: str | None = Field(None, description="the test split's file; default: held out")
    test_fraction: float = Field(
        0.2, gt=0, lt=1, description="without `test`: each client's share held out for testing"
    )
    classes: int | None = Field(
        None, ge=1, le=MAX_CLASSES, description="the number of classes; default: max label + 1"
    )

    @model_validator(mode="after")
    def _readable(self) -> ArraysData:
        if self.test is not None and "test_fraction" in self.model_fields_set:
            raise ValueError("test_fraction applies without a test file only; remove one of them")
        problem = self._problem()
        if problem is not None:
            field, message = problem
            raise refusal(field, message, getattr(self, field))
        return self

    def _problem(self) -> tuple[str, str] | None:
        """(field, what is wrong) of the first problem with the files; None when they are fine."""
        files: dict[str, ArrayFile] = {}
        for field in ("path", "test"):
            value = getattr(self, field)
            try:
                if value is not None:
                    files[field] = self.read(value)
            except InputError as err:
                return field, str(err).removeprefix(f"{value}: ")
        for field, file in files.items():
            if file.y.max() >= MAX_CLASSES:  # however the classes are found, as `classes`'s
                found = "class folders" if file.names else f"labels up to {file.y.max()}"
                return field, (
                    f"{file.y.max() + 1:,} classes ({found}), past fedhet's limit of "
                    f"{MAX_CLASSES:,}; give at most {MAX_CLASSES:,} classes, numbered from 0"
                )
        classes = self._classes()
        for field, file in files.items():
            if file.y.max() >= classes:
                return field, (
                    f"label {file.y.max()} outside 0..{classes - 1} (classes: {classes}); "
                    "raise data.classes or fix the labels"
                )
        shapes = {field: file.x.shape[1:] for field, file in files.items()}
        if len(set(shapes.values())) > 1:
            return "test", f"samples of shape {shapes['test']}, unlike path's {shapes['path']}"
        names = {field: file.names for field, file in files.items()}
        if len(set(names.values())) > 1:
            return "test", f"classes {names['test']}, unlike path's {names['path']}"
        return None

    def read(self, path: str) -> ArrayFile:
        """The checked arrays of a file of this dataset's (fedhet.data.array_files)."""
        return read_file(path)

    def _classes(self) -> int:
        files = [self.read(f) for f in (self.path, self.test) if f is not None]
        return self.classes or 1 + max(int(f.y.max()) for f in files)

    def describe(self) -> DataInfo:
        train = self.read(self.path)
        clients = None if train.client is None else len(np.unique(train.client))
        samples = len(train.y) if self.test is not None else None  # held out: known once split
        return DataInfo(sample_shape(train.x.shape[1:]), self._classes(), samples, clients)

    def identity(self) -> dict[str, Any]:
        return self.identity_of(self.read(self.path), self.test_file())

    def test_file(self) -> ArrayFile | None:
        """The checked arrays of the test file; None without one (the test split is held out)."""
        return None if self.test is None else self.read(self.test)

    def identity_of(self, train: ArrayFile, test: ArrayFile | None) -> dict[str, Any]:
        """The identity of data read from the files `train` and `test`."""
        found = {"sha256": train.sha256}
        if test is not None:
            found["test_sha256"] = test.sha256
        else:
            found["test_fraction"] = self.test_fraction
        if self.classes is not None:
            found["classes"] = self.classes
        return found


def load(config: ArraysData, seed: int) -> ArrayData:
    """The file's arrays, the test split given or held out (see the module docstring): those of
    the content the keys name, else InputError naming the file that changed."""
    train, test = config.read(config.path), config.test_file()
    config.keyed_identity(config.identity_of(train, test))
    client = None if train.client is None else np.unique(train.client, return_inverse=True)[1]
    if test is not None:
        return ArrayData(train.x, train.y, test.x, test.y, _ids(client))
    kept, held = _held_out(train, client, config.test_fraction)
    kept_client = None if client is None else _ids(client[kept])
    return ArrayData(train.x[kept], train.y[kept], train.x[held], train.y[held], kept_client)


def _held_out(
    file: ArrayFile, client: np.ndarray | None, fraction: float
) -> tuple[np.ndarray, np.ndarray]:
    """(kept, held-out) sorted row indices: per client, each class's `fraction` held out."""
    groups = np.zeros(len(file.y), np.int64) if client is None else client
    kept, held = [], []
    for group in np.unique(groups):
        rows = np.flatnonzero(groups == group)
        train, test = split_client(rows, file.y, fraction, numpy_rng(_SPLIT_SEED, "test", group))
        kept.append(train)
        held.append(test)
    return np.sort(np.concatenate(kept)), np.sort(np.concatenate(held))


def _ids(client: np.ndarray | None) -> np.ndarray | None:
    return None if client is None else client.astype(np.int64)
