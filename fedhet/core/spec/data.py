"""The `data:` section: which dataset, and how its images are prepared.

Every dataset, fedhet's own and a plug-in's, is one config class (a subclass of `DataSpec`,
fedhet.core.data_config.DataConfig) registered under the `fedhet.datasets` entry points;
`dataset_configs()` finds them, and the spec's `data.dataset` chooses among them.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field, GetJsonSchemaHandler
from pydantic_core import CoreSchema

from fedhet.core import plugins
from fedhet.core.errors import InputError
from fedhet.core.sections import OMIT_IF_DEFAULT, Count, Section, Share

DEFAULT_DATASET = "digits"


class DataSpec(Section):
    """The fields every `data:` block has; its dataset's config class adds its own."""

    # True for a dataset that its name alone says (fedhet's image datasets): FedBR's proxy
    by_name: ClassVar[bool] = False

    dataset: str
    root: str | None = Field(None, description="data root; not part of any key")
    download: bool = Field(False, description="let torchvision download; not part of any key")
    validation: Annotated[Share | None, OMIT_IF_DEFAULT] = Field(
        None,
        description="hold out this share of each client's training data, stratified by label "
        "(fedhet.data.validation); the best model is then chosen by validation accuracy",
    )
    server: Annotated[Count | None, OMIT_IF_DEFAULT] = Field(
        None,
        description="hold out this many training samples for the server before partitioning, "
        "drawn from the seed (fedhet.data.server_split): no client holds them; FedDF's real "
        "server data, and every method of the spec trains on the same clients",
    )
    channels: Annotated[int | None, OMIT_IF_DEFAULT] = Field(
        None,
        ge=1,
        le=4,
        description="repeat a grey image to this many channels (VHL's official code feeds "
        "Fashion-MNIST as 3 channels); a colour dataset must already have this many",
    )
    resize: Annotated[int | None, OMIT_IF_DEFAULT] = Field(
        None,
        ge=4,
        le=256,
        description="bilinear resize of every image, train and test, to this square side "
        "(VHL's official code: Fashion-MNIST at 32)",
    )
    scale: Annotated[Literal["standardize", "unit"], OMIT_IF_DEFAULT] = Field(
        "standardize",
        description="standardize: each channel to mean 0 and std 1 over the training set; "
        "unit: pixel values in [0, 1], no standardization (VHL's official Fashion-MNIST)",
    )

    def input_format(self) -> dict[str, Any]:
        """The format options away from their defaults, for the keys of the stages that
        compute on the images (empty by default: today's keys stay)."""
        fields = ("channels", "resize", "scale")
        return {f: getattr(self, f) for f in fields if f in self.model_dump(include=set(fields))}


def dataset_configs() -> dict[str, type[DataSpec]]:
    """Dataset name -> the config class of its `data:` block, fedhet's own and plug-ins'
    (fedhet.core.plugins), in order of name."""
    found = plugins.found(plugins.DATASETS, ())
    if DEFAULT_DATASET not in found:  # fedhet's installed metadata is older than its code
        raise InputError(
            f"fedhet's own datasets ({DEFAULT_DATASET}, ...) are not registered as entry points "
            "of its installation; reinstall fedhet (make install, or pip install -e .)"
        )
    return {name: found[name] for name in sorted(found)}  # type: ignore[misc]


def named_datasets() -> list[str]:
    """The datasets that their name alone says (`DataSpec.by_name`), sorted."""
    return [name for name, config in dataset_configs().items() if config.by_name]


def _named(name: str) -> str:
    if name not in named_datasets():
        raise ValueError(f"unknown dataset; choose one of {', '.join(named_datasets())}")
    return name


class _NamedSchema:
    """The JSON Schema of a `DatasetName`: an enum of the datasets registered when exported."""

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        return {"enum": named_datasets(), "type": "string"}


# A field naming a dataset that its name alone says (FedBR's proxy), checked against the registry
DatasetName = Annotated[str, AfterValidator(_named), _NamedSchema()]
