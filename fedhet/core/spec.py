"""Experiment specs: validated pydantic models loaded from YAML, with matrix expansion.

Every section forbids unknown fields. Fields that cannot change results (names, paths,
devices, threads, progress) live in `runtime` or are marked `exclude_from_key` so that
they never enter a stage key.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import shlex
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import PydanticCustomError

from fedhet.core import architectures, plugins, registry
from fedhet.core.errors import InputError
from fedhet.core.model_config import ModelConfig
from fedhet.core.natural_clients import natural_problem, with_natural_clients
from fedhet.core.overrides import apply_overrides, blame, keep_only, override_path
from fedhet.core.plugin_isolation import PluginError
from fedhet.core.sections import (
    MAX_CLASSES,
    MAX_CLIENTS,
    MAX_COUNT,
    MAX_FACTOR,
    MAX_LAYERS,
    MAX_SEED,
    MAX_THREADS,
    MAX_WIDTH,
    OMIT_IF_DEFAULT,
    AlgorithmSpec,
    Section,
)
from fedhet.core.system_spec import SystemSpec, absent_when_default
from fedhet.core.tune_spec import TuneSpec, tune_problem

# --- data -------------------------------------------------------------------------------

DatasetName = Literal["digits", "fmnist", "mnist", "cifar10", "cifar100", "svhn", "emnist"]


class DataSpec(Section):
    dataset: DatasetName = "digits"
    root: str | None = Field(None, description="data root; not part of any key")
    download: bool = Field(False, description="let torchvision download; not part of any key")
    validation: Annotated[float | None, OMIT_IF_DEFAULT] = Field(
        None,
        gt=0,
        lt=1,
        description="hold out this share of each client's training data, stratified by label "
        "(fedhet.data.validation); the best model is then chosen by validation accuracy",
    )
    server: Annotated[int | None, OMIT_IF_DEFAULT] = Field(
        None,
        ge=1,
        le=MAX_COUNT,
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


# --- partition --------------------------------------------------------------------------


class RotationSpec(Section):
    """Feature shift: client k's images are rotated by angles[k], or by k * step degrees."""

    angles: list[float] | None = None
    step: float = 15.0
    interpolation: Annotated[Literal["bilinear", "nearest"], OMIT_IF_DEFAULT] = Field(
        "bilinear",
        description="how rotated pixels are resampled (FedBR's code: nearest, PIL's default)",
    )


FeatureShiftKind = Literal["noise", "contrast", "blur"]
# the largest level of each kind: noise's std and blur's sigma in pixels' units, contrast's
# reduction (1 flattens every image to its mean)
FEATURE_SHIFT_MAX: dict[str, float] = {"noise": 10.0, "contrast": 1.0, "blur": 100.0}


class FeatureShiftSpec(Section):
    """Feature shift by an input transform (fedhet.data.feature_shift): client k's inputs get
    `kind` at `levels[k]`, or at max * k / (K - 1) (evenly from 0 to `max` over the K clients).
    Level 0 leaves a client's inputs as they are."""

    kind: FeatureShiftKind = Field(
        description="noise: Gaussian noise of std `level` (pixels in [0, 1]), drawn once per "
        "sample; contrast: each image scaled around its mean by 1 - `level`; blur: Gaussian "
        "blur of sigma `level` pixels"
    )
    levels: list[Annotated[float, Field(ge=0)]] | None = Field(
        None, max_length=MAX_CLIENTS, description="one level per client"
    )
    max: float | None = Field(None, ge=0, description="levels spread from 0 to max over clients")

    @model_validator(mode="after")
    def _levels_given_once(self) -> FeatureShiftSpec:
        if (self.levels is None) == (self.max is None):
            raise ValueError("give either levels (one per client) or max, not both or neither")
        ceiling = FEATURE_SHIFT_MAX[self.kind]
        given = [self.max] if self.levels is None else self.levels
        highest = max(given, default=0.0)
        if highest is not None and highest > ceiling:
            field = "max" if self.levels is None else "levels"
            raise ValueError(f"{field} reaches {highest}; {self.kind} levels go up to {ceiling}")
        return self

    def client_levels(self, clients: int) -> list[float]:
        """Each client's level."""
        if self.levels is not None:
            return list(self.levels)
        assert self.max is not None
        return [self.max * k / (clients - 1) if clients > 1 else 0.0 for k in range(clients)]


class _PartitionBase(Section):
    clients: int = Field(10, ge=1, le=MAX_CLIENTS)
    rotation: RotationSpec | None = None
    feature_shift: Annotated[FeatureShiftSpec | None, OMIT_IF_DEFAULT] = Field(
        None,
        description="a per-client input transform (noise, contrast or blur), after the rotation",
    )
    max_samples: Annotated[int | None, OMIT_IF_DEFAULT] = Field(
        None,
        ge=1,
        le=MAX_COUNT,
        description="a client dealt more samples keeps this many, drawn at random without "
        "replacement (a reduced-data edition of a partition)",
    )

    @property
    def interpolation(self) -> Literal["bilinear", "nearest"]:
        """How the rotation feature shift resamples pixels (bilinear without one)."""
        return "bilinear" if self.rotation is None else self.rotation.interpolation


class IIDPartition(_PartitionBase):
    scheme: Literal["iid"] = "iid"


class DirichletPartition(_PartitionBase):
    """Per class c: q_c ~ Dir_K(alpha), client k gets a q_c[k] share of class c."""

    scheme: Literal["dirichlet"] = "dirichlet"
    alpha: float = Field(0.5, gt=0, le=MAX_FACTOR)
    min_samples: int = Field(0, ge=0, le=MAX_COUNT, description="minimum samples per client")
    cap: Annotated[bool, OMIT_IF_DEFAULT] = Field(
        False,
        description="classes dealt in turn, a client holding N/K samples takes no more "
        "(the LDA of VHL's and FedImpro's code, with min_samples: 10)",
    )


class ClientDirichletPartition(_PartitionBase):
    """FedBR's label skew: client k draws q_k ~ Dir_C(alpha * v) and N // K samples without
    replacement from it, an exhausted class dropped and q_k renormalized."""

    scheme: Literal["client_dirichlet"] = "client_dirichlet"
    alpha: float = Field(0.1, gt=0, le=MAX_FACTOR)
    concentration: Annotated[Literal["uniform", "by_share"], OMIT_IF_DEFAULT] = Field(
        "uniform",
        description="v: uniform = all ones; by_share = each class's share of the samples no "
        "client holds yet (FedBR's code; summing to 1, so about 10x more skewed for 10 classes)",
    )


class ClassesPartition(_PartitionBase):
    """#C classes per client; each class split evenly among its owners."""

    scheme: Literal["classes"] = "classes"
    classes_per_client: int = Field(2, ge=1, le=MAX_CLASSES)
    shuffle_classes: bool = Field(
        True,
        description="False gives label-sorted contiguous blocks (client k owns classes kC..kC+C-1)",
    )


class SubsetPartition(_PartitionBase):
    """One dominant class per client plus `minor_samples` samples of every other class."""

    scheme: Literal["subset"] = "subset"
    minor_samples: int = Field(5, ge=0, le=MAX_COUNT)


class QuantityPartition(_PartitionBase):
    """Quantity skew: iid labels, client sizes proportional to a Dir_K(alpha) draw."""

    scheme: Literal["quantity"] = "quantity"
    alpha: float = Field(1.0, gt=0, le=MAX_FACTOR)
    min_samples: int = Field(1, ge=0, le=MAX_COUNT)


class RotationPartition(_PartitionBase):
    """iid labels with a per-client rotation (RotatedMNIST-style)."""

    scheme: Literal["rotation"] = "rotation"
    rotation: RotationSpec = RotationSpec()


class NaturalPartition(_PartitionBase):
    """The data's own clients (LEAF style): client k holds the samples whose client id is k."""

    scheme: Literal["natural"] = "natural"
    # filled in from the data (`_natural_clients`), so out of dumps: each run takes its data's
    clients: int = Field(
        10, ge=1, le=MAX_CLIENTS, exclude=True, description="the data's clients (filled in)"
    )


_DISCRIMINATORS = ("scheme",)  # the tag fields of the spec's discriminated unions

PartitionConfig = (
    IIDPartition
    | DirichletPartition
    | ClassesPartition
    | SubsetPartition
    | QuantityPartition
    | RotationPartition
    | ClientDirichletPartition
    | NaturalPartition
)
PartitionSpec = Annotated[PartitionConfig, Field(discriminator="scheme")]


def partition_label(p: BaseModel) -> str:
    """Short column label for a partition, like the papers' table headers."""
    base = {
        "iid": "iid",
        "dirichlet": f"alpha={getattr(p, 'alpha', '')}" + ("+cap" if getattr(p, "cap", 0) else ""),
        "client_dirichlet": f"client alpha={getattr(p, 'alpha', '')}",
        "classes": f"#C={getattr(p, 'classes_per_client', '')}",
        "subset": "subset",
        "quantity": f"quantity(alpha={getattr(p, 'alpha', '')})",
        "rotation": "rotated",
        "natural": "natural",
    }[p.scheme]
    if p.rotation is not None and p.scheme != "rotation":
        base += "+rot"
    if p.feature_shift is not None:
        base += f"+{p.feature_shift.kind}"
    if p.max_samples is not None:
        base += f", <={p.max_samples}/client"
    return base


# --- model ------------------------------------------------------------------------------


def _applies_when(**choices: tuple[str, ...]) -> dict[str, Any]:
    """Field metadata: the field only matters when each named sibling has one of these values
    (`spec show` leaves it out otherwise; the JSON Schema says so as `applies_when`)."""
    return {"json_schema_extra": {"applies_when": {k: list(v) for k, v in choices.items()}}}


class ModelSpec(ModelConfig):
    arch: Literal["mlp", "simple_cnn", "fedbr_cnn", "resnet18", "resnet20"] = "simple_cnn"
    norm: Literal["batch", "group", "none"] = "none"
    hidden: list[Annotated[int, Field(ge=1, le=MAX_WIDTH)]] = Field(
        default_factory=lambda: [200],
        max_length=MAX_LAYERS,
        description="mlp hidden widths; [] is logistic regression",
        **_applies_when(arch=("mlp",)),
    )
    channels: list[Annotated[int, Field(ge=1, le=MAX_WIDTH)]] = Field(
        default_factory=lambda: [32, 64],
        description="simple_cnn conv widths",
        **_applies_when(arch=("simple_cnn",)),
    )
    fc_width: int = Field(
        512,
        ge=1,
        le=MAX_WIDTH,
        description="simple_cnn hidden fully connected width",
        **_applies_when(arch=("simple_cnn",)),
    )
    width: int = Field(
        16,
        ge=1,
        le=MAX_WIDTH,
        description="resnet and fedbr_cnn base width (both use 64 in the papers)",
        **_applies_when(arch=("fedbr_cnn", "resnet18", "resnet20")),
    )
    groups: int = Field(
        2,
        ge=1,
        le=MAX_WIDTH,
        description="GroupNorm groups when norm=group",
        **_applies_when(norm=("group",)),
    )

    @model_validator(mode="after")
    def _two_conv_widths(self) -> ModelSpec:
        if self.arch == "simple_cnn" and len(self.channels) != 2:
            raise ValueError(
                f"channels must list 2 conv widths for simple_cnn, not {self.channels}"
            )
        problem = architectures.group_norm_problem(self)
        if problem is not None:
            raise _located_error(("groups",), problem, self.groups)
        return self

    def split_points(self) -> list[str]:
        """The stage names of the model's feature extractor (`fedhet.models.FedModel`), known
        without building it."""
        return architectures.split_points(self)

    def parameter_count(self, in_shape: tuple[int, int, int], num_classes: int) -> int:
        """The number of parameters of `fedhet.models.build_model(self, in_shape, num_classes)`,
        counted without building it (tests/test_architectures.py checks the two agree)."""
        return architectures.describe(self, in_shape, num_classes).parameter_count


# --- federation -------------------------------------------------------------------------


class FederationSpec(Section):
    rounds: int = Field(30, ge=1, le=MAX_COUNT)
    clients_per_round: int | None = Field(
        None, ge=1, le=MAX_CLIENTS, description="default: all clients"
    )
    fraction: float | None = Field(None, gt=0, le=1, description="alternative to clients_per_round")
    local_epochs: float | None = Field(1, gt=0, le=MAX_FACTOR)
    local_steps: int | None = Field(
        None, ge=1, le=MAX_COUNT, description="fixed local steps; replaces epochs"
    )
    batch_size: int = Field(32, ge=1, le=MAX_COUNT)
    lr: float = Field(0.05, gt=0)
    lr_decay: float = Field(
        1.0, gt=0, le=1, description="learning rate multiplied by this per round"
    )
    momentum: float = Field(0.0, ge=0, lt=1)
    momentum_buffers: Annotated[Literal["reset", "client"], OMIT_IF_DEFAULT] = Field(
        "reset",
        description="reset: every round's local optimizer starts with an empty momentum buffer; "
        "client: each client keeps its buffer across rounds (in its state, checkpointed)",
    )
    weight_decay: float = Field(0.0, ge=0)
    system: Annotated[SystemSpec | None, OMIT_IF_DEFAULT, AfterValidator(absent_when_default)] = (
        Field(None, description="system heterogeneity: local work, availability, stragglers")
    )

    @model_validator(mode="after")
    def _one_participation_and_one_duration(self) -> FederationSpec:
        if self.clients_per_round is not None and self.fraction is not None:
            raise ValueError("set either clients_per_round or fraction, not both")
        if self.local_steps is not None and self.local_epochs not in (None, 1):
            raise ValueError("set either local_epochs or local_steps, not both")
        if self.system is not None and self.system.sets_local_work():
            if self.local_steps is not None or self.local_epochs not in (None, 1):
                raise ValueError(
                    "system.local_epochs/local_steps replace federation's; set the local work "
                    "in one place"
                )
        if self.local_steps is None and self.local_epochs is None:
            raise ValueError("set local_epochs or local_steps to say how long clients train")
        return self


# --- algorithm --------------------------------------------------------------------------


def algorithm_configs() -> dict[str, type[AlgorithmSpec]]:
    """name -> config class of every registered algorithm (the plug-ins are loaded lazily)."""
    return registry.configs()


def _located_error(loc: tuple[str, ...], message: str, value: Any) -> ValidationError:
    """A validation error at `loc` (relative to the model being validated)."""
    error = PydanticCustomError("spec", message)
    return ValidationError.from_exception_data(
        "Spec", [{"type": error, "loc": loc, "input": value}]
    )


def _not_an_algorithm(name: Any, configs: dict[str, type[AlgorithmSpec]]) -> str:
    unloaded = registry.unloaded(name)  # a method plug-in of that name that failed to load
    if unloaded:
        return unloaded
    if name in registry.objective_fields():  # a wrapper goes on a base algorithm
        bases = [n for n, config in configs.items() if name in config.model_fields]
        base = "fedavg" if "fedavg" in bases else bases[0]
        return (
            f"{name} is an objective wrapper, not an algorithm; put it on a base algorithm "
            f"({', '.join(sorted(bases))}): algorithm: {{name: {base}, {name}: {{}}}}"
        )
    return f"unknown or missing algorithm; choose one of {', '.join(sorted(configs))}"


def _validate_algorithm(value: Any) -> AlgorithmSpec:
    """The algorithm's own config class validates the block; errors are placed under `algorithm`."""
    if isinstance(value, AlgorithmSpec):
        return value
    if not isinstance(value, dict):
        raise _located_error(("algorithm",), "must be a mapping, e.g. {name: fedavg}", value)
    configs = algorithm_configs()
    name = value.get("name")
    if not isinstance(name, str) or name not in configs:
        raise _located_error(("algorithm", "name"), _not_an_algorithm(name, configs), name)
    try:
        return registry.validated(name, value)
    except ValidationError as err:
        located = [
            {"type": e["type"], "loc": ("algorithm", *e["loc"]), "input": e["input"]}
            | ({"ctx": e["ctx"]} if "ctx" in e else {})
            for e in err.errors()
        ]
        raise ValidationError.from_exception_data("Spec", located) from None


# --- eval and runtime -------------------------------------------------------------------


class ClientTestSpec(Section):
    """Each client's own test set, drawn from the dataset's test split in the client's training
    label proportions (fedhet.data.client_test); `fedhet eval` and `fedhet report` score every
    client on it with the model that client would use."""

    per_client: int = Field(
        ge=1, le=MAX_COUNT, description="test samples per client (fewer where a class runs out)"
    )


class EvalSpec(Section):
    every: int = Field(
        1, ge=1, le=MAX_COUNT, description="evaluate the global model every N rounds"
    )
    target_accuracy: float | None = Field(None, gt=0, le=1)
    client_test: ClientTestSpec | None = Field(
        None, description="per-client test sets from the test split (eval and report only)"
    )


class ResourcesSpec(Section):
    """What one node asks of a Ray cluster (`fedhet train --ray`): gpus 0.25 lets 4 share a GPU."""

    cpus: float = Field(1.0, gt=0)
    gpus: float = Field(0.0, ge=0)


class RuntimeSpec(Section):
    """Execution settings; never part of a key."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = Field(None, ge=1, le=MAX_THREADS)
    clients: Literal["sequential", "vectorized", "fused", "auto"] = Field(
        "auto",
        description="how a round's clients train: sequential, one at a time through autograd; "
        "vectorized, the cohort as one batched computation; fused, one at a time with "
        "hand-derived MLP steps (vectorized and fused round differently in float32; a round "
        "they cannot run falls back to sequential, said once); auto, the fastest that applies "
        "(fused on CPU, else vectorized for models without convolutions, else sequential)",
    )
    checkpoint_every: int | None = Field(
        None,
        ge=1,
        le=MAX_COUNT,
        description="rounds between checkpoints, what a crash can lose (Ctrl-C loses nothing); "
        "unset: every 5 rounds, skipped while the last checkpoint is under 30 s old",
    )
    eval_batch_size: int = Field(1000, ge=1, le=MAX_COUNT)
    progress: bool = True
    tensorboard: str | None = Field(
        None, description="folder for TensorBoard events, one subfolder per run, per round"
    )
    resources: ResourcesSpec = ResourcesSpec()


# --- the spec ---------------------------------------------------------------------------


class Spec(Section):
    name: str = "experiment"
    description: str = ""
    seed: int = Field(0, ge=0, le=MAX_SEED)
    data: SerializeAsAny[DataSpec] = DataSpec()  # a plug-in's block is a DataSpec subclass
    partition: PartitionSpec = IIDPartition()
    model: SerializeAsAny[ModelConfig] = ModelSpec()
    federation: FederationSpec = FederationSpec()
    algorithm: AlgorithmSpec = Field(
        default_factory=lambda: _validate_algorithm({"name": "fedavg"})
    )
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
            data["algorithm"] = _validate_algorithm(data["algorithm"])
        return data

    @model_validator(mode="before")
    @classmethod
    def _dispatch_data_and_model(cls, data: Any) -> Any:
        """`data` and `model` validated by the config class their `dataset` and `arch` choose
        (fedhet's own or a plug-in's); a natural partition takes its clients from the data."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for section, (tag, configs, default) in _PLUGGABLE.items():
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
        problem = natural_problem(self.data, self.partition)
        if problem is not None:
            raise ValueError(problem)
        try:
            registry.checked(self.algorithm, self)
        except PluginError as err:  # the plug-in's fault, placed under its block
            raise ValueError(f"algorithm: {err}") from None
        except InputError as err:  # placed like every other validation error: file, override
            raise ValueError(str(err)) from None
        return self

    @model_validator(mode="after")
    def _set_fields_apply(self, info: ValidationInfo) -> Spec:
        """A field set away from its default must apply to the options chosen in some run (a
        matrix over `model.arch` may give `channels` to its simple_cnn runs only)."""
        if (info.context or {}).get(_MATRIX_RUN):
            return self  # checked with the whole spec
        try:
            runs = [run for _, run in expand(self)]
        except InputError:
            return self  # `expand` names the run that is invalid
        unused = _unused_setting(runs)
        if unused is not None:
            raise _located_error(*unused)
        return self

    @model_validator(mode="after")
    def _tune_applies(self, info: ValidationInfo) -> Spec:
        if self.tune is None or (info.context or {}).get(_MATRIX_RUN):
            return self
        try:
            runs = [run for _, run in expand(self)]
        except InputError:
            return self  # `expand` names the run that is invalid
        problem = tune_problem(self.tune, runs, list(self.matrix or {}), parse_run)
        if problem is not None:
            raise _located_error(*problem)
        return self

    @property
    def clients_per_round(self) -> int:
        fed, k = self.federation, self.partition.clients
        if fed.clients_per_round is not None:
            return fed.clients_per_round
        if fed.fraction is not None:
            return max(1, round(fed.fraction * k))
        return k


# --- datasets and models: fedhet's own and plug-ins' ------------------------------------


def dataset_configs() -> dict[str, type[DataSpec]]:
    """Dataset name -> the config class of its `data:` block (fedhet.core.plugins)."""
    builtin = get_args(DatasetName)
    return dict.fromkeys(builtin, DataSpec) | plugins.found(plugins.DATASETS, builtin)


def model_configs() -> dict[str, type[ModelConfig]]:
    """Architecture name -> the config class of its `model:` block (fedhet.core.plugins)."""
    builtin = get_args(ModelSpec.model_fields["arch"].annotation)
    return dict.fromkeys(builtin, ModelSpec) | plugins.found(plugins.MODELS, builtin)


# section -> (the field that chooses its config class, the classes, that field's default)
_PLUGGABLE = {
    "data": ("dataset", dataset_configs, "digits"),
    "model": ("arch", model_configs, "simple_cnn"),
}


# --- fields that apply to some options only -----------------------------------------------


def _conditions(section: type[BaseModel]) -> dict[str, dict[str, list[str]]]:
    """field -> {sibling: values} for the fields that apply only when siblings take those values."""
    found = {}
    for name, info in section.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if "applies_when" in extra:
            found[name] = extra["applies_when"]
    return found


def _applies(section: BaseModel, when: dict[str, list[str]]) -> bool:
    return all(getattr(section, k, None) in choices for k, choices in when.items())


def _unused_setting(runs: list[Spec]) -> tuple[tuple[str, str], str, Any] | None:
    """(location, message, value) of a field set away from its default in runs where it does
    not apply and in no other run; None when every set field applies somewhere."""
    for section_name in Spec.model_fields:
        sections = [getattr(run, section_name) for run in runs]
        if not isinstance(sections[0], BaseModel):
            continue
        for name, when in _conditions(type(sections[0])).items():
            default = type(sections[0]).model_fields[name].get_default(call_default_factory=True)
            setting = [s for s in sections if getattr(s, name, default) != default]
            if setting and not any(_applies(s, when) for s in setting):
                options = "; ".join(f"{k} {', '.join(v)}" for k, v in when.items())
                siblings = " or ".join(f"{section_name}.{k}" for k in when)
                message = f"applies to {options} only; remove it or set {siblings}"
                return (section_name, name), message, getattr(setting[0], name)
    return None


def _tagged_union(section: str) -> tuple[str, str, dict[str, type[BaseModel]]] | None:
    """(tag field, what the tag names, tag -> config class) of a spec section whose fields
    depend on its tag."""
    if section == "partition":
        members = get_args(PartitionConfig)
        return "scheme", "scheme", {m.model_fields["scheme"].default: m for m in members}
    if section == "algorithm":
        return "name", "algorithm", dict(algorithm_configs())
    if section in _PLUGGABLE:
        tag, configs, _ = _PLUGGABLE[section]
        return tag, tag, configs()
    return None


def _inapplicable_field(path: list[str], data: Any, overridden: bool) -> str | None:
    """The message for a field its section's scheme (or algorithm) does not take but another
    does: where it applies, and how to drop it (with overrides: by replacing the section)."""
    union = _tagged_union(path[0]) if len(path) == 2 else None
    if union is None:
        return None
    tag, kind, members = union
    owners = sorted(t for t, config in members.items() if path[1] in config.model_fields)
    if not owners:
        return None
    message = f"applies to {kind} {', '.join(owners)} only"
    section = data.get(path[0]) if isinstance(data, dict) else None
    chosen = members.get(section.get(tag)) if isinstance(section, dict) else None
    if not overridden or chosen is None:
        return f"{message}; remove it or set {path[0]}.{tag}"
    kept = {k: v for k, v in section.items() if k in chosen.model_fields}
    whole = _flow_yaml(kept)
    return f"{message}; drop it by setting the whole section: {path[0]}={shlex.quote(whole)}"


# --- loading ----------------------------------------------------------------------------


def _field_path(loc: tuple[int | str, ...], data: Any) -> list[str]:
    """The user's path to an error: pydantic's loc without the union tags it inserts right after
    a discriminated union's field (`partition.dirichlet.alpha` -> `partition.alpha`)."""
    path, node, entered = [], data, False
    for part in loc:
        tagged = isinstance(node, dict) and any(node.get(d) == part for d in _DISCRIMINATORS)
        if (entered and tagged) or str(part).startswith("function-"):
            entered = False
            continue
        path.append(str(part))
        inside = isinstance(node, dict) and part in node
        inside |= isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        node, entered = (node[part] if inside else None), True
    return path


def _unknown_field(path: list[str], data: Any) -> str:
    """The message for a field no section takes: the spelling nearest to it among its section's
    fields (those of the scheme or algorithm chosen, of all when none is), if one is close."""
    models, node = [Spec], data
    for depth, part in enumerate(path[:-1]):
        node = node.get(part) if isinstance(node, dict) else None
        union = _tagged_union(part) if depth == 0 else None
        if union is not None:
            tag, _, members = union
            chosen = members.get(node.get(tag)) if isinstance(node, dict) else None
            models = [chosen] if chosen else list(members.values())
        else:
            found = [m.model_fields[part].annotation for m in models if part in m.model_fields]
            models = [m for annotation in found for m in _models_in(annotation)]
    fields = {name for model in models for name in model.model_fields}
    close = difflib.get_close_matches(path[-1], fields, n=1)
    if close:
        return f"unknown field; did you mean {close[0]}?"
    return "unknown field; remove it or fix its spelling (`fedhet spec schema` lists the fields)"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The spec sections an annotation names (`RotationSpec | None`: RotationSpec)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _models_in(arg)]


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _format_error(err: ValidationError, source: str, data: Any, overridden: bool = False) -> str:
    """One line: where the first problem is, what is wrong, and how to fix it."""
    first = err.errors(include_url=False)[0]
    path, kind, ctx = _field_path(first["loc"], data), first["type"], first.get("ctx", {})
    value = first.get("input")
    if kind == "extra_forbidden":
        msg = _inapplicable_field(path, data, overridden) or _unknown_field(path, data)
    elif kind == "missing":
        msg = "required field is missing; add it"
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        path.append(ctx["discriminator"].strip("'"))
        if "tag" in ctx:
            msg = f"unknown value {ctx['tag']!r}; choose one of {ctx['expected_tags']}"
        else:
            msg = "missing; add it (`fedhet spec schema` lists the choices)"
    else:
        msg = first["msg"].removeprefix("Value error, ")
        msg = msg[:1].lower() + msg[1:]
        if path and not isinstance(value, dict | list):
            msg += f" (got {_short(value)})"
    more = err.error_count() - 1
    suffix = f" (+{more} more problem{'s' if more > 1 else ''})" if more else ""
    where = f"{'.'.join(path)}: " if path else ""
    return f"{source}: {where}{msg}{suffix}"


# Validation context of one run of a matrix: what applies across runs was checked with the spec
_MATRIX_RUN = "matrix_run"


def parse_spec(data: Any, source: str = "spec") -> Spec:
    """Validate a mapping into a Spec, raising InputError with a one-line message."""
    return _parse(data, source, {})


def parse_run(data: Any, source: str) -> Spec:
    """`parse_spec` for one run of a spec validated whole (a matrix run, TCT's stage 1), whose
    fields may apply only to other runs of the spec."""
    return _parse(data, source, {_MATRIX_RUN: True})


def _parse(data: Any, source: str, context: dict[str, Any]) -> Spec:
    if not isinstance(data, dict):
        raise InputError(f"{source}: a spec must be a YAML mapping, got {type(data).__name__}")
    try:
        return Spec.model_validate(data, context=context)
    except ValidationError as err:
        raise InputError(_format_error(err, source, data)) from None


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: spec file not found; pass the path of a YAML spec (see specs/)")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        message = f"{path}: cannot read the spec ({err}); pass a readable UTF-8 YAML file"
        raise InputError(message) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise InputError(f"{path}:{where}: YAML syntax error: {problem}") from None
    return data


def load_mapping(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict:
    """A spec file's mapping, `base: OTHER.yaml` resolved: OTHER's mapping (a path relative to
    this file, itself resolved the same way) with this file's fields merged over it
    (`derived`); a matrix axis set to null is dropped."""
    data = load_yaml(path)
    if not isinstance(data, dict) or "base" not in data:
        return data
    here = Path(path).resolve()
    base = data.pop("base")
    if not isinstance(base, str):
        raise InputError(f"{path}: base: give the path of the spec this one derives from")
    base_path = (here.parent / base).resolve()
    if base_path in (*_seen, here):
        raise InputError(f"{path}: base: {base} derives from itself; break the cycle")
    merged = derived(load_mapping(base_path, (*_seen, here)), data)
    if isinstance(merged.get("matrix"), dict):  # an axis set to null is dropped
        merged["matrix"] = {a: v for a, v in merged["matrix"].items() if v is not None}
    return merged


def derived(base: dict, changes: dict) -> dict:
    """`changes` merged over `base`: a section merges field by field, except a section whose
    choice (an algorithm's `name`, a partition's `scheme`) changes, which is replaced whole, as
    is every other value (a matrix axis's list included)."""
    merged = copy.deepcopy(base)
    for field, value in changes.items():
        old = merged.get(field)
        if isinstance(old, dict) and isinstance(value, dict) and not _choice_changes(old, value):
            merged[field] = derived(old, value)
        else:
            merged[field] = copy.deepcopy(value)
    return merged


def _choice_changes(old: dict, new: dict) -> bool:
    return any(tag in new and new[tag] != old.get(tag) for tag in ("name", "scheme", "arch"))


def load_spec(path: str | Path, overrides: Sequence[str] = (), only: Sequence[str] = ()) -> Spec:
    """The spec in the file at `path`, with command-line `overrides` (PATH=VALUE) applied to its
    mapping before validation, so they give exactly the keys an edit of the file would, and its
    matrix restricted by the `only` filters (AXIS=VALUE; fedhet.core.overrides)."""
    data = keep_only(apply_overrides(load_mapping(path), overrides), only)
    if not overrides:
        return parse_spec(data, str(path))
    try:
        spec = Spec.model_validate(data)
    except ValidationError as err:
        where = _field_path(err.errors(include_url=False)[0]["loc"], data)
        source = blame(str(path), overrides, where)
        raise InputError(_format_error(err, source, data, overridden=True)) from None
    for override in overrides:  # matrix axes are any string to pydantic: expanding checks them
        if override_path(override)[0] == "matrix":
            try:
                expand(spec)
            except InputError as err:
                raise InputError(f"override {override!r}: {err}") from None
    return spec


# --- matrix -----------------------------------------------------------------------------


def _set_path(data: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise InputError(f"matrix: {dotted}: {part} is not a section")
    node[leaf] = copy.deepcopy(value)


def expand(spec: Spec) -> list[tuple[dict[str, Any], Spec]]:
    """One (axis values, run spec) pair per matrix combination; a spec without matrix is one run."""
    if not spec.matrix:
        return [({}, spec)]
    base = spec.model_dump(mode="json", exclude={"matrix"}, serialize_as_any=True)
    axes = list(spec.matrix)
    runs = []
    for values in itertools.product(*(spec.matrix[a] for a in axes)):
        data = _with_axes(base, zip(axes, values, strict=True))
        axis_values = dict(zip(axes, values, strict=True))
        runs.append((axis_values, parse_run(data, f"matrix run {_run_name(axis_values)}")))
    return runs


def _run_name(axis_values: dict[str, Any]) -> str:
    """A matrix run by its axes' values as a spec writes them: `algorithm.name=fedprox, seed=1`."""
    return ", ".join(f"{axis}={_flow_yaml(value)}" for axis, value in axis_values.items())


def _flow_yaml(value: Any) -> str:
    """A value as YAML on one line (a mapping in braces)."""
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1000)
    return text.removesuffix("\n...\n").strip()


def _with_axes(base: dict[str, Any], axis_values: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """A copy of a spec's mapping with each matrix axis set to its value."""
    data = copy.deepcopy(base)
    for axis, value in sorted(axis_values, key=_application_order):
        if axis == "algorithm.name":  # a new algorithm starts from its own defaults
            data["algorithm"] = {"name": value}
        else:
            _set_path(data, axis, value)
    return data


def _application_order(axis_value: tuple[str, Any]) -> tuple[bool, int]:
    """Whole sections before the fields inside them, so e.g. `algorithm.name` and `algorithm.mu`
    axes combine whatever their order in the file."""
    axis = axis_value[0]
    return axis != "algorithm.name", axis.count(".")


def applicable_dump(section: BaseModel) -> dict[str, Any]:
    """The section with defaults filled in, less the fields that do not apply to the options
    chosen (e.g. `channels` of an mlp); a field the spec sets explicitly is always kept."""
    data = _prune(
        section, section.model_dump(mode="json", exclude_none=True, serialize_as_any=True)
    )
    if isinstance(section, Spec) and section.matrix:
        data["matrix"] = _filled_matrix(section)
    return data


def _filled_matrix(spec: Spec) -> dict[str, list[Any]]:
    """The matrix with each section it sets whole shown as its runs get it: defaults filled in."""
    base = spec.model_dump(mode="json", exclude={"matrix"}, serialize_as_any=True)
    return {
        axis: [_filled_entry(base, axis, v) if isinstance(v, dict) else v for v in values]
        for axis, values in spec.matrix.items()
    }


def _filled_entry(base: dict[str, Any], axis: str, value: dict[str, Any]) -> Any:
    try:
        node: Any = parse_run(_with_axes(base, [(axis, value)]), f"matrix {axis}")
    except InputError:  # valid only combined with another axis's value: shown as written
        return value
    for part in axis.split("."):
        node = getattr(node, part)
    return applicable_dump(node) if isinstance(node, BaseModel) else value


def _prune(section: BaseModel, data: dict[str, Any]) -> dict[str, Any]:
    conditions = _conditions(type(section))
    for name in type(section).model_fields:
        if name not in data:
            continue
        applies = _applies(section, conditions.get(name, {}))
        value = getattr(section, name)
        if not applies and name not in section.model_fields_set:
            del data[name]
        elif isinstance(value, BaseModel) and isinstance(data[name], dict):
            _prune(value, data[name])
    return data


def json_schema() -> dict[str, Any]:
    """JSON Schema of specs, with the algorithm block as the union of every algorithm's config."""
    from typing import Union

    from pydantic import create_model

    configs = tuple(algorithm_configs().values())
    algorithm_union = Annotated[Union[configs], Field(discriminator="name")]  # noqa: UP007
    default = Field(default_factory=lambda: _validate_algorithm({"name": "fedavg"}))
    data_union = Union[tuple(dict.fromkeys(dataset_configs().values()))]  # noqa: UP007
    model_union = Union[tuple(dict.fromkeys(model_configs().values()))]  # noqa: UP007
    schema_model = create_model(
        "Spec",
        __base__=Spec,
        algorithm=(algorithm_union, default),
        data=(data_union, DataSpec()),
        model=(model_union, ModelSpec()),
    )
    schema = schema_model.model_json_schema()
    axes = {name: {"type": "array", "minItems": 1, "items": items} for name, items in _axes(schema)}
    matrix = {"type": "object", "properties": axes, "additionalProperties": _ANY_AXIS}
    schema["properties"]["matrix"]["anyOf"] = [matrix, {"type": "null"}]
    schema["properties"]["base"] = {
        "type": "string",
        "description": "the spec file this one derives from (relative to it); this file's "
        "fields are merged over it",
    }
    return schema


_ANY_AXIS = {"type": "array", "minItems": 1, "items": {}}  # a deeper path, e.g. algorithm.mu


def _axes(schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(matrix axis, schema of one of its values): every field of the spec and of its sections
    (the fields of the algorithm and partition, which depend on their choice, all but the tag)."""
    sections = {n: f for n, f in schema["properties"].items() if n != "matrix"}
    for name, field in sections.items():
        yield name, _value_schema(field)
        section = schema["$defs"][field["$ref"].split("/")[-1]] if "$ref" in field else {}
        for sub, sub_field in section.get("properties", {}).items():
            yield f"{name}.{sub}", _value_schema(sub_field)
    yield "algorithm.name", {"enum": sorted(algorithm_configs())}
    yield "data.dataset", {"enum": sorted(dataset_configs())}
    yield "model.arch", {"enum": sorted(model_configs())}
    schemes = [m.model_fields["scheme"].default for m in get_args(PartitionConfig)]
    yield "partition.scheme", {"enum": sorted(schemes)}


def _value_schema(field: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in field.items() if k not in ("default", "title", "description")}
