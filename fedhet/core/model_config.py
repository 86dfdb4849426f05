"""The base of every `model:` block: fedhet's own architectures (`fedhet.core.spec.ModelSpec`)
and those of model plug-ins.

A model plug-in names, under the `fedhet.models` entry-point group, a subclass of `ModelConfig`:
its spec block (`arch: Literal["name"]` and its own fields) and `builder`, the
"package.module:function" that builds its network, imported on first use:

    def build(config, in_shape, num_classes) -> tuple[nn.Module, nn.Linear]

returning the feature extractor (inputs of shape (N, *in_shape) to flat features) and the linear
head. fedhet seeds the construction from the spec's seed and joins the two into its
`fedhet.models.FedModel`, whose single split point is `features`; every method trains it.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.core.sections import Section

NormKind = Literal["batch", "group", "none"]


class ModelConfig(Section):
    # a plug-in's "package.module:function" (see the module docstring); None for fedhet's own
    builder: ClassVar[str | None] = None

    arch: str
    norm: NormKind = Field(
        "none",
        description="the kind of the model's normalization layers (FedTAN and the BatchNorm "
        "baselines need batch)",
    )

    def split_points(self) -> list[str]:
        """The names of the stages after which the model can be split, in forward order."""
        return ["features"]

    def parameter_count(self, in_shape: tuple[int, int, int], num_classes: int) -> int | None:
        """The model's number of parameters, for the memory check; None when unknown without
        building it (the check then passes the model)."""
        return None
