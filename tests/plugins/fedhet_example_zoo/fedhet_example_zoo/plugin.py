"""What fedhet loads through the `fedhet.datasets` and `fedhet.models` entry points: the spec
blocks of the dataset and the model, and where the code that makes them lives. Light on purpose
(no torch): validating and planning a spec import only this."""

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.core.data_config import DataConfig, DataInfo
from fedhet.core.model_config import ModelConfig


class BlobsData(DataConfig):
    """`data: {dataset: blobs, clients: 4, per_client: 100, shift: 1.0}`: one Gaussian blob per
    class in `dimension` dimensions; client k's inputs are shifted by its own offset."""

    loader: ClassVar[str] = "fedhet_example_zoo.data:load"

    dataset: Literal["blobs"] = "blobs"
    clients: int = Field(4, ge=1, description="clients, each with its own input shift")
    per_client: int = Field(100, ge=2, description="samples per client, a fifth for testing")
    shift: float = Field(1.0, ge=0, description="scale of each client's input shift")
    dimension: int = Field(8, ge=1)
    classes: int = Field(3, ge=2)

    def describe(self) -> DataInfo:
        train = self.clients * (self.per_client - self.per_client // 5)
        return DataInfo((1, 1, self.dimension), self.classes, train, self.clients)


class TwoLayerConfig(ModelConfig):
    """`model: {arch: twolayer, width: 16}`: flatten, a tanh hidden layer, a linear head."""

    builder: ClassVar[str] = "fedhet_example_zoo.net:build"

    arch: Literal["twolayer"] = "twolayer"
    width: int = Field(16, ge=1, description="hidden units")

    def parameter_count(self, in_shape: tuple[int, int, int], num_classes: int) -> int:
        inputs = in_shape[0] * in_shape[1] * in_shape[2]
        return (inputs + 1) * self.width + (self.width + 1) * num_classes
