"""The image shape and number of classes of every registered dataset, known without loading it
(planning, `fedhet spec validate` and the memory check import no torch). tests/test_data.py
checks the table against the loaded datasets."""

from __future__ import annotations

from typing import NamedTuple

from fedhet.core.data_config import DataConfig
from fedhet.core.errors import InputError
from fedhet.core.spec import DataSpec


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


def data_shape(data: DataSpec) -> DataShape:
    """The spec's model input shape (its dataset's, in the spec's `data.channels` and
    `data.resize`) and its number of classes; fedhet.data.datasets loads images of this shape."""
    if isinstance(data, DataConfig):  # a plug-in's, used as given
        info = data.describe()
        return DataShape(info.shape, info.classes)
    (channels, height, width), classes = DATA_SHAPES[data.dataset]
    if data.resize is not None:
        height = width = data.resize
    channels = input_channels(data.dataset, channels, data.channels)
    return DataShape((channels, height, width), classes)


def input_channels(dataset: str, native: int, channels: int | None) -> int:
    """The channels the model sees: `channels` repeat a grey image; None keeps the `native`."""
    if channels is None or channels == native:
        return native
    if native != 1:
        raise InputError(
            f"data.channels: {dataset} has {native} channels, not {channels}; "
            "only a grey dataset's channel is repeated"
        )
    return channels
