"""A user's data file read into arrays: `.npz` (numpy) or `.parquet` (pyarrow), with its shapes,
dtypes and labels checked and its content hashed (for the keys).

- `.npz`: `x` (N x D, N x H x W or N x C x H x W real features), `y` (N integer labels) and,
  optionally, `client` (N client ids, integers or strings).
- `.parquet`: a column `y`, optionally a column `client`, and the features: every other column
  (one numeric column per feature, in the file's order).

Files are read once per process and content (`read_file` is cached by path, size and mtime).
"""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from fedhet.core.data_config import sample_shape
from fedhet.core.errors import InputError

SUFFIXES = (".npz", ".parquet")
_CHUNK = 1 << 20


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
    reader = _read_npz if resolved.suffix == ".npz" else _read_parquet
    try:
        x, y, client = reader(resolved, path)
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise InputError(f"{path}: cannot be read ({err}); save it again") from None
    _check(x, y, client, path)
    return ArrayFile(x, y, client, _sha256(resolved))


def _read_npz(resolved: Path, path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    with np.load(resolved, allow_pickle=False) as arrays:
        missing = [name for name in ("x", "y") if name not in arrays.files]
        if missing:
            raise InputError(
                f"{path}: no array {' or '.join(missing)} (it holds {', '.join(arrays.files)}); "
                "save features as x and labels as y (np.savez(path, x=..., y=...))"
            )
        client = arrays["client"] if "client" in arrays.files else None
        return arrays["x"], arrays["y"], client


def _read_parquet(resolved: Path, path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    import pyarrow.parquet as pq

    table = pq.read_table(resolved)
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
    try:
        sample_shape(x.shape[1:])
    except ValueError as err:
        raise InputError(f"{path}: x: {err}") from None
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise InputError(f"{path}: x holds NaN or infinite values; remove or impute them")
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise InputError(f"{path}: y is {y.dtype} of shape {y.shape}; give 1-D integer labels")
    if len(y) and y.min() < 0:
        raise InputError(f"{path}: y holds negative labels; number the classes from 0")
    for name, values in (("y", y), ("client", client)):
        if values is not None and len(values) != len(x):
            raise InputError(f"{path}: {name} has {len(values)} values for the {len(x)} rows of x")
    if client is not None and (client.ndim != 1 or client.dtype.kind not in "iuU"):
        raise InputError(f"{path}: client is {client.dtype}; give 1-D integer or string ids")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
