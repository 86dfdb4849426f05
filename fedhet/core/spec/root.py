"""The root of a spec: its sections, and the checks between them within one run."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, SerializeAsAny, model_validator

from fedhet.core import plugins, registry
from fedhet.core.errors import InputError
from fedhet.core.model_config import ModelConfig
from fedhet.core.natural_clients import natural_problem, own_tests_problem, with_natural_clients
from fedhet.core.plugin_isolation import PluginError
from fedhet.core.sections import MAX_SEED, OMIT_IF_DEFAULT, AlgorithmSpec, Section
from fedhet.core.spec.algorithm import validate_algorithm
from fedhet.core.spec.data import DataSpec
from fedhet.core.spec.evaluation import EvalSpec
from fedhet.core.spec.federation import FederationSpec
from fedhet.core.spec.model import ModelSpec
from fedhet.core.spec.partition import IIDPartition, PartitionSpec
from fedhet.core.spec.runtime import RuntimeSpec
from fedhet.core.spec.tagged import PLUGGABLE, validate_data
from fedhet.core.tune_spec import TuneSpec


class Spec(Section):
    """An experiment: one run, or one per combination of its `matrix`. Validating it checks
    each section and how they fit together; the checks across a matrix's runs are the
    loader's (fedhet.core.spec.loading), so that a run validates alone."""

    name: str = "experiment"
    description: str = ""
    seed: int = Field(0, ge=0, le=MAX_SEED)
    data: SerializeAsAny[DataSpec] = Field(default_factory=lambda: validate_data({}))
    partition: PartitionSpec = IIDPartition()
    model: SerializeAsAny[ModelConfig] = ModelSpec()
    federation: FederationSpec = FederationSpec()
    algorithm: AlgorithmSpec = Field(default_factory=lambda: validate_algorithm({"name": "fedavg"}))
    eval: EvalSpec = EvalSpec()
    runtime: RuntimeSpec = RuntimeSpec()
    matrix: dict[str, Annotated[list[Any], Field(min_length=1)]] | None = Field(
        None, description="dotted field path -> values; expands into one run per combination"
    )
    tune: Annotated[TuneSpec | None, OMIT_IF_DEFAULT] = Field(
        None, description="`fedhet tune`: each method's hyperparameters, selected on validation"
    )

    @model_validator(mode="before")
    @classmethod
    def _dispatch_algorithm(cls, data: Any) -> Any:
        if isinstance(data, dict) and "algorithm" in data:
            data = dict(data)
            data["algorithm"] = validate_algorithm(data["algorithm"])
        return data

    @model_validator(mode="before")
    @classmethod
    def _dispatch_data_and_model(cls, data: Any) -> Any:
        """`data` and `model` validated by the config class their `dataset` and `arch` choose
        (fedhet's own or a plug-in's); a natural partition takes its clients from the data."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for section, (tag, configs, default) in PLUGGABLE.items():
            if section in data:
                data[section] = plugins.validate_section(
                    data[section], section, tag, configs(), default
                )
        return with_natural_clients(data)

    @model_validator(mode="after")
    def _cross_checks(self) -> Spec:
        cpr = self.federation.clients_per_round
        if cpr is not None and cpr > self.partition.clients:
            raise ValueError(
                f"federation.clients_per_round={cpr} exceeds partition.clients="
                f"{self.partition.clients}; lower it or add clients"
            )
        angles = self.partition.rotation.angles if self.partition.rotation else None
        if angles is not None and len(angles) != self.partition.clients:
            raise ValueError(
                f"partition.rotation.angles has {len(angles)} entries for "
                f"{self.partition.clients} clients; give one angle per client"
            )
        shift = self.partition.feature_shift
        if shift is not None and shift.levels is not None:
            if len(shift.levels) != self.partition.clients:
                raise ValueError(
                    f"partition.feature_shift.levels has {len(shift.levels)} entries for "
                    f"{self.partition.clients} clients; give one level per client"
                )
        problem = natural_problem(self.data, self.partition) or own_tests_problem(self)
        if problem is not None:
            raise ValueError(problem)
        try:
            registry.checked(self.algorithm, self)
        except PluginError as err:  # the plug-in's fault, placed under its block
            raise ValueError(f"algorithm: {err}") from None
        except InputError as err:  # placed like every other validation error: file, override
            raise ValueError(str(err)) from None
        return self

    @property
    def clients_per_round(self) -> int:
        fed, k = self.federation, self.partition.clients
        if fed.clients_per_round is not None:
            return fed.clients_per_round
        if fed.fraction is not None:
            return max(1, round(fed.fraction * k))
        return k
