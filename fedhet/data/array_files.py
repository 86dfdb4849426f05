"""A user's data file read into arrays: `.npz` (numpy) or `.parquet` (pyarrow), with its shapes,
dtypes and labels checked and its content hashed (for the keys).

- `.npz`: `x` (N x D, N x H x W or N x C x H x W real features), `y` (N integer labels) and,
  optionally, `client` (N client ids, integers or strings); other arrays are left out, with a
  warning naming them.
- `.parquet`: a column `y`, optionally a column `client`, and the features: every other column
  (one numeric column per feature, in the file's order).

A file is read once per process and content (`read_file` is cached by path, size and mtime):
its bytes are read into memory in one pass, hashed, and parsed from there, so the hash names
exactly the bytes the arrays come from.
"""

from __future__ import annotations

import hashlib
import io
import logging
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from fedhet.core.data_config import feature_problem, sample_shape
from fedhet.core.errors import InputError

SUFFIXES = (".npz", ".parquet")
NPZ_ARRAYS = ("x", "y", "client")

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class ArrayFile:
    x: np.ndarray
    y: np.ndarray
    client: np.ndarray | None  # as stored: integers or strings
    sha256: str
    names: tuple[str, ...] | None = None  # the classes' names, where the data has them


def read_file(path: str) -> ArrayFile:
    """The checked arrays of the file at `path` (relative to the working directory); InputError
    naming the file and what to fix."""
    resolved = Path(path).expanduser().resolve()
    if resolved.suffix not in SUFFIXES:
        raise InputError(f"{path}: not a .npz or .parquet file; save your arrays as one")
    try:
        stat = resolved.stat()
    except OSError:
        raise InputError(f"{path}: file not found; give a path relative to {Path.cwd()}") from None
    return _read(resolved, stat.st_size, stat.st_mtime_ns, path)


@lru_cache(maxsize=4)
def _read(resolved: Path, size: int, mtime_ns: int, path: str) -> ArrayFile:
    try:
        content = resolved.read_bytes()
    except OSError as err:
        raise InputError(f"{path}: cannot be read ({err.strerror}); check the file") from None
    if not content:
        raise InputError(f"{path}: an empty file (0 bytes); save your arrays into it")
    reader = _read_npz if resolved.suffix == ".npz" else _read_parquet
    try:
        x, y, client = reader(io.BytesIO(content), path)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise InputError(f"{path}: cannot be read ({err}); save it again") from None
    _check(x, y, client, path)
    return ArrayFile(x, y, client, hashlib.sha256(content).hexdigest())


def _read_npz(content: io.BytesIO, path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    if not zipfile.is_zipfile(content):
        raise InputError(
            f"{path}: not a .npz archive (the zip of arrays that np.savez writes); save your "
            "arrays with np.savez(path, x=..., y=...)"
        )
    content.seek(0)
    with np.load(content, allow_pickle=False) as arrays:
        missing = [name for name in ("x", "y") if name not in arrays.files]
        if missing:
            raise InputError(
                f"{path}: no array {' or '.join(missing)} (it holds {', '.join(arrays.files)}); "
                "save features as x and labels as y (np.savez(path, x=..., y=...))"
            )
        unused = [name for name in arrays.files if name not in NPZ_ARRAYS]
        if unused:
            log.warning(
                f"{path}: arrays {', '.join(unused)} are not used (fedhet reads "
                f"{', '.join(NPZ_ARRAYS)}); leave them out to silence this"
            )
        client = arrays["client"] if "client" in arrays.files else None
        return arrays["x"], arrays["y"], client


def _read_parquet(
    content: io.BytesIO, path: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    import pyarrow.parquet as pq

    table = pq.read_table(content)
    if "y" not in table.column_names:
        raise InputError(f"{path}: no column y; name the label column y")
    features = [name for name in table.column_names if name not in ("y", "client")]
    if not features:
        raise InputError(f"{path}: no feature columns; add one numeric column per feature")
    columns = {name: _column(table, name, path) for name in table.column_names}
    x = np.stack([columns[name] for name in features], axis=1)
    return x, columns["y"], columns.get("client")


def _column(table, name: str, path: str) -> np.ndarray:
    column = table.column(name)
    if column.null_count:
        raise InputError(f"{path}: column {name} has {column.null_count} missing values; fill them")
    values = column.to_numpy()
    if values.dtype.kind == "O" and name != "client":
        raise InputError(f"{path}: column {name} is {column.type}; give a numeric column")
    return values.astype(str) if values.dtype.kind == "O" else values


def _check(x: np.ndarray, y: np.ndarray, client: np.ndarray | None, path: str) -> None:
    if x.dtype.kind not in "biuf":
        raise InputError(f"{path}: x holds {x.dtype} values; give real-valued numeric features")
    if x.ndim < 2:
        raise InputError(f"{path}: x has shape {x.shape}; give one row of features per sample")
    if not len(x):
        raise InputError(f"{path}: x holds no samples (shape {x.shape}); give at least one row")
    try:
        sample_shape(x.shape[1:])
    except ValueError as err:
        raise InputError(f"{path}: x: {err}") from None
    problem = feature_problem(x)
    if problem is not None:
        raise InputError(f"{path}: x {problem}")
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise InputError(f"{path}: y is {y.dtype} of shape {y.shape}; give 1-D integer labels")
    if len(y) and y.min() < 0:
        raise InputError(f"{path}: y holds negative labels; number the classes from 0")
    for name, values in (("y", y), ("client", client)):
        if values is not None and len(values) != len(x):
            raise InputError(f"{path}: {name} has {len(values)} values for the {len(x)} rows of x")
    if client is not None and (client.ndim != 1 or client.dtype.kind not in "iuU"):
        raise InputError(f"{path}: client is {client.dtype}; give 1-D integer or string ids")
