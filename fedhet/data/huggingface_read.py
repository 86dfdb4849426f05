"""A Hugging Face dataset opened through the `datasets` library, its files hashed, its columns
read into arrays (for fedhet.data.huggingface).

`path` is, in this order:
- a folder written by `save_to_disk` (it holds dataset_dict.json or state.json): opened with
  `load_from_disk`;
- any other folder: its Parquet or Arrow files, opened with `load_dataset(folder)` (the library
  names the splits after the files: train-*.parquet, test/*.arrow, ...);
- otherwise a hub name ("owner/name"), opened with `load_dataset(name)` from the local Hugging
  Face cache (HF_HOME, HF_DATASETS_CACHE). The library's offline mode is set unless
  `data.download` is true, so nothing is fetched: a name not in the cache is refused in one line.

The content hash (the key's) covers the bytes of every file under the folder (relative names in
sorted order), or for a hub name the cached Arrow files of the two splits read: a changed byte
changes the key, a moved folder does not. `datasets` is imported here only, on first use.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.core.errors import InputError
from fedhet.data.folder_hash import ContentHash, Stamp, stamp
from fedhet.data.image_folder import stacked_pixels


class FieldError(InputError):
    """An input error of one field of the `data:` block."""

    def __init__(self, field: str, message: str):
        super().__init__(field, message)
        self.field, self.message = field, message

    def __str__(self) -> str:
        return f"data.{self.field}: {self.message}"


SAVED_MARKERS = ("dataset_dict.json", "state.json")  # what save_to_disk writes at the top
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def open_split(path: str, split: str, field: str, download: bool) -> Any:
    """The `split` of the dataset at `path` (a `datasets.Dataset`); InputError naming `field`
    (data.split or data.test_split) and the splits there are when it has no such split."""
    folder = _folder(path)
    splits = _open(path, download, () if folder is None else stamp(sorted(_files(folder))))
    if split not in splits:
        raise FieldError(
            field, f"{path} has no split {split!r} (its splits: {', '.join(splits)}); name one"
        )
    return splits[split]


def content_hash(path: str, parts: list[Any]) -> str:
    """The sha256 of the data at `path`: its folder's files, or for a hub name the cached files
    of `parts` (the splits read)."""
    folder = _folder(path)
    if folder is not None:
        files, root = sorted(_files(folder)), folder
    else:
        files = sorted({Path(c["filename"]) for part in parts for c in part.cache_files})
        root = Path(os.path.commonpath([f.parent for f in files])) if files else Path(".")
    return _hashed(root, stamp(files))


def _files(folder: Path) -> list[Path]:
    return [f for f in folder.rglob("*") if f.is_file()]


def column_kind(part: Any, column: str) -> str:
    """How fedhet reads `column` of split `part`: image, array, integer, text, or other (the
    library's type name)."""
    import datasets

    feature = part.features[column]
    if isinstance(feature, datasets.Image):
        return "image"
    if isinstance(feature, datasets.ClassLabel):
        return "integer"
    arrays = (datasets.Array2D, datasets.Array3D, datasets.Array4D, datasets.Array5D)
    leaf = _leaf_value(feature)
    dtype = getattr(leaf, "dtype", None)
    if dtype in ("string", "large_string"):
        return "text"
    if not isinstance(leaf, (datasets.Value, *arrays)) or dtype is None:
        return type(feature).__name__
    if dtype == "bool" or dtype.startswith(("int", "uint")):
        scalar = leaf is feature and isinstance(leaf, datasets.Value)
        return "integer" if scalar else "array"
    if dtype.startswith("float"):
        return "array"
    return dtype


def column_values(part: Any, column: str, where: str) -> np.ndarray:
    """`column` of split `part` as one array, a row per sample; an image column as N x C x H x W
    pixels in [0, 1] (grey when every image is, else RGB); InputError naming `where` when the
    rows differ in shape."""
    if column_kind(part, column) == "image":
        return stacked_pixels(part[column][:], where, "resize them to one size")
    values = part.with_format("numpy")[column][:]
    if isinstance(values, list) or values.dtype == object:
        raise InputError(f"{where}: rows of different shapes; give every sample the same shape")
    return values


@lru_cache(maxsize=4)
def _open(path: str, download: bool, files: Stamp) -> dict[str, Any]:
    """Split name -> `datasets.Dataset` of the dataset at `path` (see the module docstring), its
    folder's `files` as stamped (opened again when one changes)."""
    datasets = _library(download)
    folder = _folder(path)
    try:
        if folder is not None and any((folder / m).is_file() for m in SAVED_MARKERS):
            opened = datasets.load_from_disk(str(folder))
        elif folder is not None:
            opened = datasets.load_dataset(str(folder))
        else:
            opened = datasets.load_dataset(path)
    except Exception as err:  # the library's many failures: each is the input's
        raise FieldError("path", _unreadable(path, folder, download, err)) from None
    if isinstance(opened, datasets.Dataset):
        raise FieldError(
            "path",
            f"{path} holds one Dataset, not a DatasetDict of splits; save a "
            "DatasetDict({'train': ..., 'test': ...}) instead",
        )
    return dict(opened)


def _folder(path: str) -> Path | None:
    """`path` as a folder; None for a hub name; InputError when it names a missing path."""
    folder = Path(path).expanduser()
    if folder.is_dir():
        return folder.resolve()
    if folder.exists() or path.startswith((".", "/", "~")) or path.count("/") > 1:
        raise FieldError(
            "path",
            f"not a folder (looked in {Path.cwd()}); give a save_to_disk folder, a folder of "
            "Parquet or Arrow files, or a hub name (owner/name)",
        )
    return None


def _library(download: bool) -> Any:
    """`datasets`, in offline mode unless `download` (set before its import, and on it after)."""
    if not download:
        os.environ.update(dict.fromkeys(OFFLINE_VARIABLES, "1"))
    import datasets
    import huggingface_hub.constants

    if not download:
        datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
        datasets.config.HF_DATASETS_OFFLINE = True
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()  # not its notes on using the cache
    return datasets


def _unreadable(path: str, folder: Path | None, download: bool, err: Exception) -> str:
    reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
    if folder is not None:
        return (
            f"holds no dataset the datasets library reads ({reason}); give a save_to_disk "
            "folder or a folder of Parquet or Arrow files"
        )
    if not download:
        return (
            "not a folder, nor a dataset in the local Hugging Face cache (HF_HOME, "
            "HF_DATASETS_CACHE); data.download is false, so nothing was fetched: set "
            "data.download: true to fetch it"
        )
    return f"could not be fetched from the Hugging Face hub ({reason})"


def _leaf_value(feature: Any) -> Any:
    """The scalar type inside (possibly nested) sequence and array features."""
    while getattr(feature, "feature", None) is not None:
        feature = feature.feature
    return feature


@lru_cache(maxsize=4)
def _hashed(root: Path, files: Stamp) -> str:
    content_hash = ContentHash(root)
    for name, _, _ in files:
        content_hash.add(name, Path(name).read_bytes())
    return content_hash.hexdigest()
