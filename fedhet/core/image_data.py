"""The base of fedhet's image datasets (digits, the torchvision ones): a dataset that its name
alone says, in the image format the spec's `data.channels`, `data.resize` and `data.scale` ask
for. Each is one class (fedhet.data.digits, fedhet.data.torchvision_sets) registered under the
`fedhet.datasets` entry points, as every other dataset is:

    class MnistData(TorchvisionData):
        dataset: Literal["mnist"] = "mnist"
        shape = (1, 28, 28)            # its images' own (channels, height, width)
        classes = 10
        train_samples = 60_000
        ...

Its `loader`, "package.module:function", is imported on first use and reads the integer pixels:

    def read(config, root: DataRoot) -> Pixels

fedhet.data.image_format turns them into the spec's format. tests/test_data_registry.py checks
every registered dataset's shape, classes and size against what it loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np
from pydantic import model_validator

from fedhet.core.data_config import DataConfig, DataInfo, refusal


class DataRoot(NamedTuple):
    """The folder a dataset's files are read from, and what chose it (for messages)."""

    path: Path
    source: str


@dataclass(frozen=True)
class Pixels:
    """An image dataset as read: integer pixels (uint8, N x C x H x W, values 0..max_value)
    and int64 labels."""

    train_pixels: np.ndarray
    train_labels: np.ndarray
    test_pixels: np.ndarray
    test_labels: np.ndarray
    class_names: tuple[str, ...]
    max_value: int = 255


class ImageDataConfig(DataConfig):
    by_name = True
    shape: ClassVar[tuple[int, int, int]]  # its images' own (channels, height, width)
    classes: ClassVar[int]
    train_samples: ClassVar[int]

    def describe(self) -> DataInfo:
        """The model's input shape (in the spec's `channels` and `resize`), classes and size."""
        channels, height, width = self.shape
        if self.resize is not None:
            height = width = self.resize
        return DataInfo(
            (self.channels or channels, height, width), self.classes, self.train_samples
        )

    def identity(self) -> dict[str, Any] | None:
        return None  # the name says which data: no entry in any key

    @model_validator(mode="after")
    def _used_as_given(self) -> ImageDataConfig:  # replaces DataConfig's: the options apply
        native = self.shape[0]
        if self.channels not in (None, native) and native != 1:
            message = (
                f"{self.dataset} has {native} channels, not {self.channels}; "
                "only a grey dataset's channel is repeated"
            )
            raise refusal("channels", message, self.channels)
        return self
