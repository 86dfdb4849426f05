"""A method's description: its validated config, which also plans its runs.

The `algorithm:` block of a spec is validated into the method's `MethodConfig`, and that object
answers every question asked of a method before training: the stages a run needs (`plan`), the
learning rate of each round, the score of a final artifact that holds no network, and where the
code that trains it lives (`trainer`, imported on first use by `trainer_class`). Nothing here
imports torch, so validating, planning and reporting never load it.

An objective wrapper (VHL) describes itself the same way: its config, an `ObjectiveConfig`,
plans the stages and extra model outputs it adds to whichever method it is composed into.
"""

from __future__ import annotations

from functools import cache
from importlib import import_module
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field

from fedhet.core.errors import InputError, RunError
from fedhet.core.sections import OMIT_IF_DEFAULT, AlgorithmSpec, Momentum, Section
from fedhet.engine.schedule import round_lr
from fedhet.engine.train_plan import train_node

if TYPE_CHECKING:
    import zarr

    from fedhet.core.pipeline import RunContext, StageNode
    from fedhet.core.spec import FederationSpec, Spec
    from fedhet.metrics.accuracy import Scores

ModelChoice = Literal["final", "best"]


class ObjectiveConfig(Section):
    """Base of an objective wrapper's config: what the wrapper adds to a run's plan."""

    def upstream(self, spec: Spec) -> dict[str, StageNode]:
        """Stages the objective needs before training (role -> node)."""
        return {}

    def extra_outputs(self, num_classes: int) -> int:
        """Model outputs the objective needs beyond the dataset's classes."""
        return 0

    def scored_extra_outputs(self, num_classes: int) -> int:
        """Of the extra outputs, how many the evaluation's argmax ranges over (0: a prediction
        is always one of the dataset's classes)."""
        return 0

    def check(self, spec: Spec) -> None:
        """Checks against the rest of the spec; raise InputError naming the field."""

    def display_name(self) -> str:
        """What labels join to the algorithm's name (`FedAvg+VHL`); by default the config's
        class name less a `Spec` or `Config` ending."""
        return type(self).__name__.removesuffix("Spec").removesuffix("Config")

    def settings(self) -> list[str]:
        """The wrapper's non-default settings a label names (as `AlgorithmSpec.settings`)."""
        return []


def refuse_text(spec: Spec, field: str, method: str, steps: str | None) -> None:
    """InputError naming `field` when `method`'s `steps` (what it does to inputs; None:
    nothing) meet text data, whose samples are token ids (fedhet.core.data_config.DataInfo)."""
    describe = getattr(spec.data, "describe", None)
    if steps is not None and describe is not None and describe().tokens:
        raise InputError(
            f"{field}: {method} {steps}, which text ({spec.data.dataset} token ids) cannot "
            "take; choose a method that trains on its inputs as given (fedavg, fedprox, ...)"
        )


class MethodConfig(AlgorithmSpec):
    """Base of every method's config; the defaults are FedAvg's."""

    # Raised when a change alters a method's results, so its stored runs are recomputed
    # (0, the default, adds nothing to the key: runs from before revisions existed stay valid)
    revision: ClassVar[int] = 0
    # True when the trainer's evaluation_states are the clients' own models: they are then stored
    personalized: ClassVar[bool] = False
    # "package.module:Class" of the method's trainer; None: no federated training of its own
    trainer: ClassVar[str | None] = "fedhet.engine.trainer:Trainer"
    # Stored metrics that mean nothing for the method (centralized: one model, so no weight
    # divergence between clients): reports and plots leave them out
    undefined_metrics: ClassVar[frozenset[str]] = frozenset()
    # False where the method's clients' states are not theirs to extend with momentum buffers
    # (`federation.momentum_buffers: client`): its own optimizers, or states that are models
    keeps_momentum_buffers: ClassVar[bool] = True

    local_momentum: Annotated[Momentum | None, OMIT_IF_DEFAULT] = Field(
        None,
        description="the clients' SGD momentum for this algorithm; default: federation.momentum",
    )

    def client_momentum(self, fed: FederationSpec) -> float:
        """The momentum of the clients' local SGD: `local_momentum`, else federation's."""
        return fed.momentum if self.local_momentum is None else self.local_momentum

    def shared_settings(self) -> list[str]:
        """The algorithm's own momentum, when it sets one."""
        return [] if self.local_momentum is None else [f"momentum={self.local_momentum:g}"]

    def plan(self, spec: Spec) -> StageNode:
        """The run's final stage node, its upstream stages beneath it."""
        return train_node(spec)

    def learning_rates(self, spec: Spec) -> list[float]:
        """The learning rate of each round of the run's stored metrics."""
        return [round_lr(spec.federation, r) for r in range(spec.federation.rounds)]

    def stage_starts(self, spec: Spec) -> list[int]:
        """The rounds after which a new stage of the run starts (TCT's stage 2), for plots."""
        return []

    def extendable(self, spec: Spec, rounds: int) -> bool:
        """Whether the first `rounds` rounds of a run of `spec` are the run of `spec` stopped
        after `rounds` rounds: then a stored shorter run is continued instead of recomputed
        (fedhet.engine.extension). True when nothing in a round depends on the run's total
        rounds; this checks the learning rates, and a method whose rounds depend on the total
        in another way says so here."""
        shorter = spec.model_copy(
            update={"federation": spec.federation.model_copy(update={"rounds": rounds})}
        )
        return self.learning_rates(shorter) == self.learning_rates(spec)[:rounds]

    def score_artifact(
        self, ctx: RunContext, node: StageNode, artifact: zarr.Group, model: ModelChoice
    ) -> Scores | None:
        """Scores of the `model` that the run's final artifact holds, for a method whose final
        artifact holds no network (TCT's linear model); None: a `train` artifact, whose
        network `fedhet eval` scores itself."""
        return None

    def input_steps(self) -> str | None:
        """What the method's local steps do to the inputs themselves that token ids (text)
        cannot take (Mixup: mixes two samples' inputs); None: it trains on inputs as given."""
        return None

    def check(self, spec: Spec) -> None:
        """Checks against the rest of the spec, run when it is validated (a method with checks
        of its own extends this one): inputs it can train on, at most one objective wrapper,
        and the wrapper's own."""
        refuse_text(spec, "algorithm.name", self.name, self.input_steps())
        on = [field for field in self.objective_fields if getattr(self, field) is not None]
        if len(on) > 1:
            raise InputError(
                f"algorithm: {', '.join(on)} each replace the local objective; set only one"
            )
        for config in self.objectives():
            config.check(spec)
        if spec.federation.momentum_buffers == "client":
            if not self.keeps_momentum_buffers:
                raise InputError(
                    f"federation.momentum_buffers: client is not supported by {self.name}; "
                    "use reset"
                )
            if self.client_momentum(spec.federation) == 0:
                raise InputError(
                    f"federation.momentum_buffers: client keeps nothing: {self.name}'s clients "
                    "train without momentum; set federation.momentum (or algorithm.local_momentum) "
                    "or use reset"
                )

    def objectives(self) -> list[ObjectiveConfig]:
        """The configs of the objective wrappers turned on (at most one trains)."""
        found = (getattr(self, field) for field in self.objective_fields)
        return [config for config in found if config is not None]

    def objective_upstream(self, spec: Spec) -> dict[str, StageNode]:
        """The stages the active objectives need before training (VHL: its virtual dataset)."""
        nodes: dict[str, StageNode] = {}
        for config in self.objectives():
            nodes.update(config.upstream(spec))
        return nodes

    def extra_outputs(self, num_classes: int) -> int:
        """Model outputs the active objectives need beyond the dataset's classes."""
        return sum(config.extra_outputs(num_classes) for config in self.objectives())

    def scored_outputs(self, num_classes: int) -> int:
        """The model outputs scored at evaluation (the first ones): the dataset's classes, plus
        the extra outputs an objective asks to predict over."""
        extra = sum(config.scored_extra_outputs(num_classes) for config in self.objectives())
        return num_classes + extra

    def trainer_class(self) -> type[Any]:
        """The class that trains this method (`fedhet.engine.trainer.Trainer` or a subclass)."""
        if self.trainer is None:
            raise InputError(f"algorithm.name: {self.name!r} has no federated training of its own")
        return _import_trainer(self.name, self.trainer)


@cache
def _import_trainer(name: str, path: str) -> type[Any]:
    module, _, attribute = path.partition(":")
    try:
        return getattr(import_module(module), attribute)
    except Exception as err:  # a plug-in's code failing to import is the plug-in's failure
        raise RunError(
            f"algorithm {name!r}: cannot import its trainer {path}: {type(err).__name__}: {err}"
        ) from err
