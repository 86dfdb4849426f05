"""The `digits` dataset, fedhet's default: scikit-learn's bundled 8x8 handwritten digits, with a
fixed stratified 80/20 train/test split. It needs no download and no setup.

    data: {dataset: digits}
"""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np

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
    from sklearn.datasets import load_digits

    bunch = load_digits()
    pixels = bunch.images.astype(np.uint8)[:, None]
    labels = bunch.target.astype(np.int64)
    test = _stratified_test_mask(bunch.target, TEST_FRACTION, _SPLIT_SEED)
    return Pixels(
        pixels[~test],
        labels[~test],
        pixels[test],
        labels[test],
        class_names=tuple(str(c) for c in bunch.target_names),
        max_value=16,
    )


def _stratified_test_mask(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mask = np.zeros(len(labels), dtype=bool)
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        mask[members[: round(fraction * len(members))]] = True
    return mask
