"""Config parts several methods share (torch-free, as every method config).

Personalized methods:
- `OwnModelsConfig`: a method whose clients each keep a model, or model layers, of their own in
  their client state, which is what is evaluated (APFL, Ditto, pFedMe, FedPer, FedRoD, ...).
- `LayerSplitConfig`: one that splits the model at a count of layers from the output, checked
  against the model (FedPer, LG-FedAvg, FedRep); `layers_from_output` declares that count.
- `FineTunedConfig`: one whose clients fine-tune the global model at evaluation (FedAvg-FT,
  FedBABU), its steps and learning rate.

Input mixup of local batches (fedhet.engine.mixup): `MixupAlpha`, the alpha of its
lambda ~ Beta(alpha, alpha) (mixup's own; FedBR's and GroupDRO's option, None there: off).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import Field

from fedhet.core.architectures import layer_split_problem
from fedhet.core.errors import InputError
from fedhet.core.sections import MAX_COUNT, MAX_LAYERS, LearningRate
from fedhet.engine.description import MethodConfig

MixupAlpha = Annotated[float, Field(gt=0, le=MAX_COUNT)]


class OwnModelsConfig(MethodConfig):
    """Each client's own model is what is evaluated (and stored with the run)."""

    personalized: ClassVar[bool] = True
    # 1: each client's model scored on its own validation and test samples, not the pooled
    # sets (fedhet.engine.own_evaluation)
    revision: ClassVar[int] = 1
    # the clients' states are models (or their layers), not theirs to extend with momentum buffers
    keeps_momentum_buffers: ClassVar[bool] = False


def layers_from_output(least: int, description: str) -> Any:
    """A count of the model's layers, from the output (1: the head), at least `least`."""
    return Field(1, ge=least, le=MAX_LAYERS, description=description)


class LayerSplitConfig(OwnModelsConfig):
    """The model split at `split_field`, a count of layers from the output (the split's layers
    stay on each client, or those below them)."""

    split_field: ClassVar[str] = "personal_layers"

    def check(self, spec: Any) -> None:
        super().check(spec)
        count = getattr(self, self.split_field)
        problem = layer_split_problem(spec.model, count)
        if problem:
            raise InputError(f"algorithm.{self.split_field}: {count} {problem}")


class FineTunedConfig(MethodConfig):
    """Each client's model is the global one fine-tuned on its data, at every evaluation."""

    personalized: ClassVar[bool] = True
    # 1: each client's model scored on its own validation and test samples, not the pooled
    # sets (fedhet.engine.own_evaluation)
    revision: ClassVar[int] = 1
    finetune_steps: int = Field(
        10, ge=0, le=MAX_COUNT, description="local SGD steps of fine-tuning at evaluation"
    )
    finetune_lr: LearningRate | None = Field(
        None, description="the fine-tuning learning rate; default: federation.lr"
    )
