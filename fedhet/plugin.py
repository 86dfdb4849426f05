"""What a method author imports: the one public module for writing a fedhet method.

fedhet's own methods (`fedhet/methods/<name>/`) import only this module and their own folder,
as a third-party plug-in does (an import contract in pyproject.toml keeps it so). A method is a
package with up to four parts; docs/how-to/write-a-method.md walks through a complete one.

Describing a method (light: validating and planning a spec import no torch)
    Method(name, configs, objectives, stages, commands)
        What the `fedhet.methods` entry point names: the method's configs (one per algorithm),
        objective wrappers, the modules that register its stages, and its commands.
    MethodConfig
        Base of an algorithm's config, the `algorithm:` block of a spec (a pydantic model): its
        `name`, its fields, `plan` (the run's stages; by default the train stage alone),
        `learning_rates`, `check`, and the class variables `trainer` ("package.module:Class",
        imported on first use), `revision` (raise it when a change alters results),
        `personalized`, `undefined_metrics` and `display_name` (the paper's spelling of the
        method, default its `name`). Its label in report rows, legends and tables is the
        display name, then what `settings()` names (the non-default settings, `symbol=value`
        or a short phrase) in one parenthesis, comma-separated: `FedBR (index pairs,
        momentum=0.9)`. Labels enter no key.
    ObjectiveConfig, ObjectiveEntry
        An objective wrapper (VHL): the config it adds to every algorithm that accepts
        objectives (`display_name()`, joined to the algorithm's by '+', and `settings()`), and
        its registration.
    OwnModelsConfig, LayerSplitConfig, layers_from_output, FineTunedConfig
        Bases of personalized methods' configs (fedhet.engine.config_parts): clients that
        keep models of their own, a model split at a count of layers from the output (and that
        count's field), fine-tuning at evaluation (its steps and learning rate).
    MixupAlpha
        The type of input mixup's alpha, lambda ~ Beta(alpha, alpha) (mixup, FedBR, GroupDRO).
    Section, OMIT_IF_DEFAULT, MAX_COUNT, MAX_WIDTH, MAX_SEED, MAX_CLASSES, MAX_LAYERS
        A config's nested sections and the bounds fedhet's own fields use.
    Count, Share, Width, Epochs, LearningRate, Weight, Momentum
        The bounded types fedhet's own fields share (fedhet.core.sections), a field adding its
        default and description: `lam: Weight = Field(0.1, description=...)`. A count (1 to
        MAX_COUNT), a part of a whole (0 < x < 1), a layer's width, local epochs (> 0), a step
        size (> 0), a loss term's weight or a weight decay (>= 0), a running average's decay
        (0 <= x < 1).
    Spec, FederationSpec, DatasetName, parse_run, expand
        The validated spec a config plans from.
    ModelChoice
        "final" | "best": which stored model a score is of.
    data_shape, norm_kinds, parameter_layers, layer_split_problem
        A spec's input shape, the kinds of normalization layer its model has, its layers that
        hold parameters, and why its last k layers cannot be split from the rest (for checks).

Training: the trainer and its one client step
    Trainer
        The federated training of an algorithm; the base class is FedAvg. Override what
        differs: `client_step`, `aggregate`, `init_server_state`, `initial_client_state`,
        `download`/`shared` (what crosses the network), `synchronized_first_step`,
        `evaluation_states`, `build_model`, and a client's start and finish: `own_names` (the
        model entries each client holds for itself: it trains from its own copies,
        `client_start`, and keeps what it trained them to; Local, FedPer, FedBN) and
        `client_finish` (what a trained client sends and keeps besides, read from its job's
        `context`: FedImpro's statistics, Ditto's personal model). Every executor runs them,
        so a method that only starts its clients from models of their own keeps the engine's
        `client_update` and trains vectorized.
        `self.setup` is the run's TrainSetup; `self.setup.extras[role]` the artifact of an
        upstream stage the config's `plan` added.
        Rounds count from 0 in every hook (`round` of `client_step`, `client_sgd`, `download`,
        `aggregate`, `synchronized_first_step`, `round_metrics`; `ClientJob.round`): the rounds
        completed before this one (fine-tuning a personalized evaluation, `FineTuned`, takes
        `client_sgd`'s settings of round 0: its steps are an evaluation's, not a round's).
        Logs, tables, exports and figures number the same round from 1: the hooks' round r is
        their round r + 1, and `decay ** round` is 1 in the first round.
    ClientStep
        A method's part of a client's local SGD, written once: `extras` (the client's own
        tensors), `loss` (a term added to the data loss; `client_loss` when the term reads the
        client's extras, as FedDyn's), `correct` (gradients before the
        optimizer step), `after_step` (parameters after it), `finish` (what a trained client
        uploads and keeps). Its tensors (`Stacked`: name -> tensor) carry a leading client dim:
        the sequential executor runs it for one client, the vectorized executor for the round's
        cohort, so it is never written twice (fedhet.engine.client_step has FedProx's as an
        example).
    Proximal
        The client step mu/2 ||w - anchor||^2 (FedProx's), which the fused executor also runs.
    ClientJob, ClientResult, Traffic
        One client's work in a round, its result, and the traffic a round adds.
    SGDSettings, sgd
        A client's local optimizer (lr, momentum, weight decay): on its job (`ClientJob.sgd`,
        from `Trainer.client_sgd`), the one place every executor and method reads it; torch's
        SGD over a model with them.
    A trainer whose data term differs overrides `local_loss` (what it reads for one client,
    built by `client_context(job)`, on `job.context`: per-client state lives on the job or in
    `job.client_state`, never on the trainer); one whose clients train in a way no client step
    states (two phases, an inner optimization per step, two optimizers) overrides
    `client_update`. Either declares `vectorizable = False`, with a comment saying why.
    PartlyShared, PartlyLocal, FineTuned, fine_tune
        Personalized training: a trainer whose named entries never cross the network while the
        rest is averaged (FedBABU's head), one whose named layers stay on each client, its
        `own_names` (FedPer, LG-FedAvg, FedRep, FedRoD); k local SGD steps of a model on a
        client's training samples (fine-tuning at evaluation: FedAvg-FT, FedBABU), and a trainer
        evaluated so.
    PersonalModels, TrainedBeside, OwnModel, stored, to_store
        A trainer whose clients each keep a model of their own (under a prefix in their client
        state: `stored`, `to_store`) that is what is evaluated (pFedMe); one whose own model (an
        `OwnModel`, the client context) takes a step at each local step beside the client's copy
        of the global model (APFL, Ditto).
    Mixer, Mixup, MixedBatches
        Input mixup of a local batch (Zhang et al. 2018), drawn from a seeded generator: the one
        helper of every method that mixes its clients' batches (mixup, FedBR's mixup option);
        MixedBatches, a trainer mixin whose clients mix every local batch (mixup, GroupDRO's
        mixup_alpha).

Stages
    stage(name)
        Registers the function that computes a stage's artifact (a Zarr group).
    StageNode(name, version, config, upstream)
        A stage of a run; its key hashes these, so two runs that agree on them share it.
    train_node(spec, **upstream), partition_node(spec)
        fedhet's own train and partition stages, to plan a method's runs on.
    RunContext, ensure, ArtifactStore, create_array
        The context a stage runs in (`ctx.upstream(node, role)`), computing a node, the store.

Running
    Engine.from_spec(spec, folder, partition=None, ...)
        The engine of one run: the round loop, sampling, evaluation, metrics, checkpoints.
        `Engine.from_spec(spec, folder).run()` trains a spec's run without a store.
    TrainSetup, build_setup
        What a run trains on: spec, dataset, clients, device (the stages of TCT and FedBR build
        one too).

Tensors, models and metrics
    Tensors, tensors
        A model state (name -> tensor) and its helpers (clone, zeros_like, weighted_average).
    LocalStats, Divergence, effective_steps, num_local_steps, steps_for_epochs
        A client's local training in numbers: steps, mean and first loss; a non-finite loss; the
        displacement of SGD with momentum in units of lr times a gradient; the local steps of
        a round, and of a number of epochs.
    FedModel, build_model, ClientData, load_data
        fedhet's models, a client's samples, the datasets.
    seeded_mlp, WithPart, scale_gradient, gradient_only
        A 3-layer MLP initialized from a derived seed (a projection head, a domain classifier),
        a classifier carrying such a part under a name of its own, a layer that scales the
        gradient flowing back through it (negative: gradient reversal), and a loss term that
        adds its gradient but not its value.
    evaluate
        (accuracy, mean cross-entropy) of a model on samples, as the engine scores its rounds.
    Scores, class_accuracies, LossFn, client_gradient_variance, summarize
        Metrics.
    stage_progress, round_note, run_metrics, write_metrics, COST_METRICS, tensorboard,
    figure_format, image_grid
        For a method with a training stage of its own (TCT): progress lines and a round's note
        in them, stored metrics (COST_METRICS: those of a round's costs, not of its model),
        TensorBoard events, figures.

Commands (a method's `commands`: a typer.Typer whose commands join fedhet's command line)
    SpecPath, OverridesArg, OnlyOpt, StoreOpt, DataRootOpt
        The arguments and options of every spec command, as fedhet's own commands declare them
        (typer `Annotated` aliases): SPEC, [PATH=VALUE]..., --only, --store, --data-root. The
        command's `ctx.obj` lends the command line's `load` (the checked spec), `out` and `err`.

Errors
    InputError (exit 2: a bad spec, naming the field), RunError (exit 1), DivergedError.

Random numbers
    torch_generator(seed, *path), derive_seed(seed, *path): every draw from the spec's seed.

The names above Training are imported with this module; the rest (torch, typer) on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from fedhet.core.architectures import layer_split_problem, norm_kinds, parameter_layers
from fedhet.core.errors import DivergedError, InputError, RunError
from fedhet.core.pipeline import RunContext, StageNode, ensure, stage
from fedhet.core.registry import Method, ObjectiveEntry
from fedhet.core.rng import derive_seed, torch_generator
from fedhet.core.sealed import create_array
from fedhet.core.sections import (
    MAX_CLASSES,
    MAX_COUNT,
    MAX_LAYERS,
    MAX_SEED,
    MAX_WIDTH,
    OMIT_IF_DEFAULT,
    Count,
    Epochs,
    LearningRate,
    Momentum,
    Section,
    Share,
    Weight,
    Width,
)
from fedhet.core.spec import DatasetName, FederationSpec, Spec, expand, parse_run
from fedhet.core.store import ArtifactStore
from fedhet.data.partition_plan import partition_node
from fedhet.data.shapes import data_shape
from fedhet.engine.config_parts import (
    FineTunedConfig,
    LayerSplitConfig,
    MixupAlpha,
    OwnModelsConfig,
    layers_from_output,
)
from fedhet.engine.description import MethodConfig, ModelChoice, ObjectiveConfig, refuse_text
from fedhet.engine.train_plan import train_node

# The torch side, imported on first use: name -> (module, attribute; None: the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    "ClientData": ("fedhet.data.clients", "ClientData"),
    "ClientJob": ("fedhet.engine.trainer", "ClientJob"),
    "ClientResult": ("fedhet.engine.trainer", "ClientResult"),
    "ClientStep": ("fedhet.engine.client_step", "ClientStep"),
    "DataRootOpt": ("fedhet.core.command_line", "DataRootOpt"),
    "Divergence": ("fedhet.engine.local", "Divergence"),
    "Engine": ("fedhet.engine.loop", "Engine"),
    "FedModel": ("fedhet.models", "FedModel"),
    "LocalStats": ("fedhet.engine.local", "LocalStats"),
    "LossFn": ("fedhet.metrics.cgv", "LossFn"),
    "MixedBatches": ("fedhet.engine.mixup", "MixedBatches"),
    "OnlyOpt": ("fedhet.core.command_line", "OnlyOpt"),
    "OverridesArg": ("fedhet.core.command_line", "OverridesArg"),
    "Mixer": ("fedhet.engine.mixup", "Mixer"),
    "Mixup": ("fedhet.engine.mixup", "Mixup"),
    "FineTuned": ("fedhet.engine.personal", "FineTuned"),
    "OwnModel": ("fedhet.engine.personal", "OwnModel"),
    "PartlyLocal": ("fedhet.engine.personal", "PartlyLocal"),
    "PartlyShared": ("fedhet.engine.personal", "PartlyShared"),
    "PersonalModels": ("fedhet.engine.personal", "PersonalModels"),
    "Proximal": ("fedhet.engine.client_step", "Proximal"),
    "TrainedBeside": ("fedhet.engine.personal", "TrainedBeside"),
    "SGDSettings": ("fedhet.engine.local", "SGDSettings"),
    "Scores": ("fedhet.metrics.accuracy", "Scores"),
    "SpecPath": ("fedhet.core.command_line", "SpecPath"),
    "Stacked": ("fedhet.engine.client_step", "Stacked"),
    "StoreOpt": ("fedhet.core.command_line", "StoreOpt"),
    "Tensors": ("fedhet.engine.tensors", "Tensors"),
    "Traffic": ("fedhet.engine.trainer", "Traffic"),
    "TrainSetup": ("fedhet.engine.setup", "TrainSetup"),
    "WithPart": ("fedhet.engine.modules", "WithPart"),
    "Trainer": ("fedhet.engine.trainer", "Trainer"),
    "build_model": ("fedhet.models", "build_model"),
    "build_setup": ("fedhet.engine.setup", "build_setup"),
    "class_accuracies": ("fedhet.metrics.accuracy", "class_accuracies"),
    "client_gradient_variance": ("fedhet.metrics.cgv", "client_gradient_variance"),
    "effective_steps": ("fedhet.engine.local", "effective_steps"),
    "evaluate": ("fedhet.engine.loop", "evaluate"),
    "figure_format": ("fedhet.figures", "figure_format"),
    "fine_tune": ("fedhet.engine.personal", "fine_tune"),
    "image_grid": ("fedhet.figures", "image_grid"),
    "load_data": ("fedhet.data.datasets", "load_data"),
    "num_local_steps": ("fedhet.engine.system", "num_local_steps"),
    "round_note": ("fedhet.engine.progress", "round_note"),
    "run_metrics": ("fedhet.engine.run_format", "run_metrics"),
    "COST_METRICS": ("fedhet.engine.run_format", "COST_METRICS"),
    "gradient_only": ("fedhet.engine.modules", "gradient_only"),
    "scale_gradient": ("fedhet.engine.modules", "scale_gradient"),
    "sgd": ("fedhet.engine.local", "sgd"),
    "seeded_mlp": ("fedhet.engine.modules", "seeded_mlp"),
    "stored": ("fedhet.engine.personal", "stored"),
    "stage_progress": ("fedhet.engine.progress", "stage_progress"),
    "steps_for_epochs": ("fedhet.engine.system", "steps_for_epochs"),
    "summarize": ("fedhet.metrics.summary", "summarize"),
    "tensorboard": ("fedhet.engine.tensorboard", None),
    "tensors": ("fedhet.engine.tensors", None),
    "to_store": ("fedhet.engine.personal", "to_store"),
    "write_metrics": ("fedhet.engine.run_format", "write_metrics"),
}

__all__ = [
    "MAX_CLASSES",
    "MAX_COUNT",
    "MAX_LAYERS",
    "MAX_SEED",
    "MAX_WIDTH",
    "OMIT_IF_DEFAULT",
    "ArtifactStore",
    "Count",
    "DatasetName",
    "DivergedError",
    "Epochs",
    "FineTunedConfig",
    "FederationSpec",
    "InputError",
    "LayerSplitConfig",
    "LearningRate",
    "Method",
    "MethodConfig",
    "MixupAlpha",
    "Momentum",
    "refuse_text",
    "ModelChoice",
    "ObjectiveConfig",
    "ObjectiveEntry",
    "OwnModelsConfig",
    "RunContext",
    "RunError",
    "Section",
    "Share",
    "Spec",
    "StageNode",
    "Weight",
    "Width",
    "create_array",
    "data_shape",
    "derive_seed",
    "ensure",
    "expand",
    "layer_split_problem",
    "layers_from_output",
    "norm_kinds",
    "parameter_layers",
    "parse_run",
    "partition_node",
    "stage",
    "torch_generator",
    "train_node",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = import_module(module)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
