"""The `digits` dataset, fedhet's default: scikit-learn's bundled 8x8 handwritten digits, with a
fixed stratified 80/20 train/test split. It needs no download and no setup.

    data: {dataset: digits}
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np

from fedhet.core.errors import RunError
from fedhet.core.image_data import DataRoot, ImageDataConfig, Pixels

TEST_FRACTION = 0.2
_SPLIT_SEED = 20240601  # fixed: the digits split never depends on an experiment seed


class DigitsData(ImageDataConfig):
    loader: ClassVar[str] = "fedhet.data.digits:read"
    shape = (1, 8, 8)
    classes = 10
    train_samples = 1438  # 1797 less the stratified 20% test split

    dataset: Literal["digits"] = "digits"


def read(config: DigitsData, root: DataRoot) -> Pixels:
    """The digits (pixel values 0..16), from scikit-learn's copy: no data root."""
    table = _bundled_digits()
    pixels = table[:, :-1].reshape(-1, 8, 8).astype(np.uint8)[:, None]
    labels = table[:, -1].astype(np.int64)
    test = _stratified_test_mask(labels, TEST_FRACTION, _SPLIT_SEED)
    return Pixels(
        pixels[~test],
        labels[~test],
        pixels[test],
        labels[test],
        class_names=tuple(str(c) for c in range(10)),
        max_value=16,
    )


def _bundled_digits() -> np.ndarray:
    """scikit-learn's `digits.csv.gz` (one row per image: 64 pixels, then the label), parsed as
    its `load_digits` does, but found without importing scikit-learn (1 s of imports: scipy,
    pandas) on every run of a digits spec."""
    package = importlib.util.find_spec("sklearn")
    if package is None or not package.submodule_search_locations:
        raise RunError("data: dataset digits needs scikit-learn (pip install scikit-learn)")
    path = Path(package.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    if not path.is_file():  # another layout: ask scikit-learn itself
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return np.column_stack([bunch.data, bunch.target])
    with gzip.open(path, mode="rt", encoding="utf-8") as compressed:
        return np.loadtxt(compressed, delimiter=",")


def _stratified_test_mask(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mask = np.zeros(len(labels), dtype=bool)
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        mask[members[: round(fraction * len(members))]] = True
    return mask
