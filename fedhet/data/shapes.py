"""A spec's model input shape and classes, known without loading its data (planning, `fedhet spec
validate` and the memory check import no torch): its dataset's config describes them
(`describe()`, fedhet.core.data_config), in the spec's `data.channels` and `data.resize`."""

from __future__ import annotations

from typing import NamedTuple

from fedhet.core.data_config import DataConfig


class DataShape(NamedTuple):
    image: tuple[int, int, int]  # (channels, height, width)
    classes: int


def data_shape(data: DataConfig) -> DataShape:
    """The spec's model input shape and its number of classes; fedhet.data.datasets loads data of
    this shape."""
    info = data.describe()
    return DataShape(info.shape, info.classes)
