"""The `model:` section of fedhet's own architectures (a plug-in's is its own ModelConfig)."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, model_validator

from fedhet.core import architectures, plugins
from fedhet.core.model_config import ModelConfig
from fedhet.core.sections import MAX_LAYERS, MAX_WIDTH, Width
from fedhet.core.spec.conditions import applies_when
from fedhet.core.spec.located import located_error


class ModelSpec(ModelConfig):
    arch: Literal["mlp", "simple_cnn", "fedbr_cnn", "resnet18", "resnet20"] = "simple_cnn"
    norm: Literal["batch", "group", "none"] = "none"
    hidden: list[Width] = Field(
        default_factory=lambda: [200],
        max_length=MAX_LAYERS,
        description="mlp hidden widths; [] is logistic regression",
        **applies_when(arch=("mlp",)),
    )
    channels: list[Width] = Field(
        default_factory=lambda: [32, 64],
        description="simple_cnn conv widths",
        **applies_when(arch=("simple_cnn",)),
    )
    fc_width: Width = Field(
        512,
        description="simple_cnn hidden fully connected width",
        **applies_when(arch=("simple_cnn",)),
    )
    width: Width = Field(
        16,
        description="resnet and fedbr_cnn base width (both use 64 in the papers)",
        **applies_when(arch=("fedbr_cnn", "resnet18", "resnet20")),
    )
    groups: int = Field(
        2,
        ge=1,
        le=MAX_WIDTH,
        description="GroupNorm groups when norm=group",
        **applies_when(norm=("group",)),
    )

    @model_validator(mode="after")
    def _two_conv_widths(self) -> ModelSpec:
        if self.arch == "simple_cnn" and len(self.channels) != 2:
            raise ValueError(
                f"channels must list 2 conv widths for simple_cnn, not {self.channels}"
            )
        problem = architectures.group_norm_problem(self)
        if problem is not None:
            raise located_error(("groups",), problem, self.groups)
        return self

    def split_points(self) -> list[str]:
        """The stage names of the model's feature extractor (`fedhet.models.FedModel`), known
        without building it."""
        return architectures.split_points(self)

    def parameter_count(self, in_shape: tuple[int, int, int], num_classes: int) -> int:
        """The number of parameters of `fedhet.models.build_model(self, in_shape, num_classes)`,
        counted without building it (tests/test_architectures.py checks the two agree)."""
        return architectures.describe(self, in_shape, num_classes).parameter_count


def model_configs() -> dict[str, type[ModelConfig]]:
    """Architecture name -> the config class of its `model:` block (fedhet.core.plugins)."""
    builtin = get_args(ModelSpec.model_fields["arch"].annotation)
    return dict.fromkeys(builtin, ModelSpec) | plugins.found(plugins.MODELS, builtin)
