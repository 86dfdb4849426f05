"""The image shape and number of classes of every registered dataset, known without loading it
(planning, `fedhet spec validate` and the memory check import no torch). tests/test_data.py
checks the table against the loaded datasets."""

from __future__ import annotations

from typing import NamedTuple


class DataShape(NamedTuple):
    image: tuple[int, int, int]  # (channels, height, width)
    classes: int


DATA_SHAPES: dict[str, DataShape] = {
    "digits": DataShape((1, 8, 8), 10),
    "mnist": DataShape((1, 28, 28), 10),
    "fmnist": DataShape((1, 28, 28), 10),
    "emnist": DataShape((1, 28, 28), 47),
    "cifar10": DataShape((3, 32, 32), 10),
    "cifar100": DataShape((3, 32, 32), 100),
    "svhn": DataShape((3, 32, 32), 10),
}
