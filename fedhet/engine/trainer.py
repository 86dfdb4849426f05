"""The trainer: the federated training of a method. The base class is FedAvg; every method's
trainer overrides only what differs. (What a method plans before training is its config's,
fedhet.engine.description.MethodConfig.)

A trainer is a few functions over explicit state:
- `init_server_state(global_state)`: extra server-side tensors (e.g. SCAFFOLD's control), and
  `initial_client_state(client)`: a client's state before its first round (empty by default);
- `client_step(round, global_state, server_state)`: the method's part of a client's local SGD
  (`fedhet.engine.client_step.ClientStep`: a loss term, a gradient correction, a parameter
  correction after each step, and what a trained client uploads and keeps), written once: the
  sequential executor runs it one client at a time, the vectorized one for the round's cohort;
- `aggregate(round, global_state, server_state, results, weights)`: the new global state;
- hooks: `synchronized_first_step` (a lockstep step across the round's clients, returning the
  `Traffic` it adds), `download`/`shared` (what crosses the network, for accounting),
  `evaluation_states` (personalized models to evaluate) and `build_model`;
- `client_sgd(round, client, lr)`: the client's local optimizer settings, carried by its job
  (`ClientJob.sgd`), the one place every executor and method reads them;
- a client's start and finish, which every executor runs: `own_names`, the model entries each
  client holds for itself (Local: all; FedPer: its personal layers; FedBN: its BatchNorm
  entries), from which `client_start(job)` is the state it trains from (the vectorized executor
  stacks the cohort's) and which `client_finish(job, state)` keeps; it also says what else the
  client sends or keeps once trained (FedImpro's statistics, Ditto's personal model).
A method whose data term differs (Mixup's mixed batches, MOON's contrastive term, DANN's domain
loss) overrides `local_loss`, and builds what that term reads for one client's job in
`client_context(job)` (its seeded draws, its frozen anchor models, its update count: on the job,
never on the trainer, which the round's clients share; `client_finish` reads it too);
`client_optimizer(job, model)` gives a part of the model settings of its own (DANN's domain
classifier). A method whose clients train in a way the engine's loop cannot run (FedBR's
adversarial rounds, pFedMe's inner problem, FedRep's two phases) overrides `client_update`.
Any of these declares `vectorizable = False`, saying why: its clients then train one at a time.
The engine owns the round loop, sampling, evaluation, metrics and checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

import torch
from torch import nn

from fedhet.data.clients import ClientData
from fedhet.engine import momentum_buffers, objectives, tensors
from fedhet.engine.client_step import ClientStep, OneClient
from fedhet.engine.description import MethodConfig
from fedhet.engine.local import LocalStats, SGDSettings, batch_schedule, local_sgd, sgd
from fedhet.engine.setup import TrainSetup
from fedhet.engine.tensors import Tensors


@dataclass
class ClientJob:
    """One client's work in one round."""

    round: int
    client: ClientData
    model: nn.Module  # loaded with the client's start (`Trainer.client_start`)
    global_state: Tensors
    server_state: Tensors
    client_state: Tensors  # persists across rounds for this client (e.g. control variates)
    sgd: SGDSettings  # the client's local optimizer (`Trainer.client_sgd`), read only from here
    generator: torch.Generator
    steps: int  # local steps this round (fedhet.engine.system: the federation's, or drawn)
    first_step: Callable[[nn.Module], torch.Tensor] | None = None
    # what the client's loss reads during this job (`Trainer.client_context`), set when it starts
    context: Any = None


@dataclass
class ClientResult:
    client: int
    state: Tensors  # the client's model state after local training
    num_samples: int
    stats: LocalStats
    upload: Tensors = field(default_factory=dict)  # extra tensors sent to the server


@dataclass(frozen=True)
class Traffic:
    """Communication a round adds beyond the model exchange (e.g. FedTAN's synchronized step)."""

    bytes_up: int = 0  # summed over the round's clients
    bytes_down: int = 0  # summed over the round's clients
    rounds: int = 0  # extra server-client round trips


class Trainer:
    # False for a trainer whose clients train one at a time: its own `local_loss`,
    # `client_optimizer` or `client_update`, which no vectorized round runs (a comment says why)
    vectorizable: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.own_training()
        if own and cls.vectorizable:
            raise TypeError(
                f"{cls.__name__} overrides {own[0]}, which no vectorized round runs: declare "
                "vectorizable = False, or state the change as its client_step"
            )

    @classmethod
    def own_training(cls) -> list[str]:
        """The hooks of local training the trainer overrides that no vectorized round runs."""
        hooks = ("client_update", "local_loss", "client_optimizer")
        return [hook for hook in hooks if getattr(cls, hook) is not getattr(Trainer, hook)]

    def __init__(self, config: MethodConfig, setup: TrainSetup):
        self.config = config
        self.setup = setup
        self.fed = setup.spec.federation
        self.momentum = config.client_momentum(self.fed)  # of the clients' local SGD
        # each client's momentum buffer is kept in its state across rounds
        self.keeps_buffers = self.fed.momentum_buffers == "client" and self.momentum > 0

    # --- model --------------------------------------------------------------------------

    @cached_property
    def param_names(self) -> frozenset[str]:
        """Names of the model's trainable parameters (the rest of a state are buffers)."""
        return frozenset(n for n, _ in self.build_model().named_parameters())

    def build_model(self) -> nn.Module:
        from fedhet.models import build_model

        ds = self.setup.dataset
        spec = self.setup.spec
        outputs = ds.num_classes + self.config.extra_outputs(ds.num_classes)
        return build_model(spec.model, ds.shape, outputs, spec.seed)

    @cached_property
    def objective(self) -> objectives.LocalObjective:
        """The data term of the local loss: cross-entropy, or the composed method's (VHL)."""
        return objectives.build(self.config, self.setup, lambda: self.build_model().feature_dim)

    # --- server side --------------------------------------------------------------------

    def init_server_state(self, global_state: Tensors) -> Tensors:
        return {}

    def initial_client_state(self, client: ClientData) -> Tensors:
        """A client's persistent state before its first round (e.g. FedDyn's alpha scaled by
        the client's size); empty by default."""
        return {}

    def shared(self, state: Tensors) -> Tensors:
        """The part of a model state that crosses the network (all of it by default)."""
        return state

    def download(self, round: int, server_state: Tensors) -> Tensors:
        """Extra tensors the server sends each sampled client in round `round` besides the
        model."""
        return {}

    def aggregate(
        self,
        round: int,
        global_state: Tensors,
        server_state: Tensors,
        results: list[ClientResult],
        weights: list[float],
    ) -> Tensors:
        return tensors.weighted_average([r.state for r in results], weights)

    def round_metrics(
        self, round: int, results: list[ClientResult], weights: list[float]
    ) -> dict[str, float]:
        """Metrics the method measures in a round beyond the engine's (FedDF's ensemble and
        average on the validation split), from the round's results and aggregation weights
        (none in a round nobody reports); stored per round with the run's. None by default."""
        return {}

    def synchronized_first_step(
        self, round: int, model: nn.Module, jobs: list[ClientJob], weights: list[float]
    ) -> Traffic:
        """Optionally set `job.first_step` for every job (a lockstep step across clients).

        Called once per round, before any client trains, with `model` holding the global state.
        By default it only accounts the objective's one-off broadcast to every client that
        will train (VHL's virtual data).
        """
        sent = tensors.nbytes(self.objective.broadcast()) if round == 0 else 0
        return Traffic(bytes_down=len(self.setup.holders) * sent)

    def evaluation_states(
        self, global_state: Tensors, client_states: dict[int, Tensors]
    ) -> list[Tensors]:
        """Model states whose test metrics are averaged into a round's test accuracy and loss."""
        return [global_state]

    def global_model(self, global_state: Tensors) -> Tensors | None:
        """The federation's one model, scored on the test set beside the clients' own (`fedhet
        eval`'s global_accuracy); None for a method that has none: layers held by the clients
        alone (FedPer, FedBN, Local), whose server copies are the initial model's."""
        return global_state

    # --- client side --------------------------------------------------------------------

    def client_step(self, round: int, global_state: Tensors, server_state: Tensors) -> ClientStep:
        """The round's client step (FedAvg's adds nothing), built from what the round's clients
        share; each client's own tensors come from its state (`ClientStep.extras`)."""
        return ClientStep()

    @property
    def own_names(self) -> frozenset[str]:
        """The model-state entries each client holds for itself (Local: all of them; FedPer its
        personal layers; FedBN its BatchNorm entries): a client trains from its own copies of
        them (`client_start`) and keeps what it trained them to (`client_finish`). None by
        default: every client trains from the global model and keeps nothing of it."""
        return frozenset()

    def own_model(self, global_state: Tensors, client_state: Tensors) -> Tensors:
        """A client's model: `global_state` with the client's own copies of `own_names` (the
        server's copies, the initial model's, before its first round)."""
        own = self.own_names
        if not own:
            return global_state
        return {n: client_state.get(n, v) if n in own else v for n, v in global_state.items()}

    def client_start(self, job: ClientJob) -> Tensors:
        """The model state a client's local training starts from, which every executor loads
        (the vectorized one stacks the cohort's): the round's global state with the client's
        own entries (`own_model`)."""
        return self.own_model(job.global_state, job.client_state)

    def client_finish(self, job: ClientJob, state: Tensors) -> tuple[Tensors, Tensors]:
        """(upload, kept) once the client trained to model `state`, beside its client step's
        (`ClientStep.finish`): the tensors it sends the server, and the entries its client
        state takes on; by default nothing sent, and its `own_names` entries of `state` kept.
        A method whose client context holds what the client sends or keeps (FedImpro's running
        statistics, Ditto's personal model) adds it here, reading `job.context`."""
        own = self.own_names
        return {}, {n: v.clone() for n, v in state.items() if n in own}

    def client_sgd(self, round: int, client: ClientData, lr: float) -> SGDSettings:
        """The local optimizer of `client` in round `round`, whose step size is `lr` (the
        federation's momentum, or the algorithm's `local_momentum`, and weight decay): what its
        job carries to every executor."""
        return SGDSettings(lr, self.momentum, self.fed.weight_decay)

    def client_context(self, job: ClientJob) -> Any:
        """What the client's `local_loss` reads while it trains in this job, built as it starts
        (e.g. its seeded mixup draws, its frozen anchor models): per-client state lives on the
        job, never on the trainer, which the round's clients share. None by default."""
        return None

    def local_loss(
        self, job: ClientJob, model: nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        """The data term of a client's loss (the client step adds its own); `job.context` holds
        what `client_context` built for the job."""
        return self.objective.loss(model, x, y, job.generator)

    def client_optimizer(self, job: ClientJob, model: nn.Module) -> torch.optim.Optimizer:
        """The optimizer of a client's local steps: torch's SGD with the job's settings. (DANN's
        gives its domain classifier settings of its own; a step moves only the parameters its
        loss reached.)"""
        return sgd(model, job.sgd)

    def local_steps(self, job: ClientJob) -> int:
        return job.steps

    def client_batches(self, job: ClientJob):
        return batch_schedule(
            job.client.n, self.fed.batch_size, self.local_steps(job), job.generator
        )

    def client_update(self, job: ClientJob) -> ClientResult:
        """One client's local SGD with the round's client step, as a cohort of one."""
        job.context = self.client_context(job)
        model = job.model
        step = self.client_step(job.round, job.global_state, job.server_state)
        one = OneClient(step, model, step.extras(job.client_state), job.sgd.lr)
        optimizer = self.client_optimizer(job, model)
        carried = 0.0
        if self.keeps_buffers:
            carried = momentum_buffers.restore(optimizer, model, job.client_state)
        stats = local_sgd(
            model,
            job.client,
            self.client_batches(job),
            optimizer,
            lambda m, x, y: one.loss(self.local_loss(job, m, x, y)),
            one.before_step,
            one.after_step,
            job.first_step,
        )
        if self.keeps_buffers:
            momentum_buffers.keep(optimizer, model, job.client_state, stats.steps, carried)
            stats.carried = carried
        return self.finished(job, step, tensors.clone(model.state_dict()), stats)

    def finished(
        self, job: ClientJob, step: ClientStep, state: Tensors, stats: LocalStats
    ) -> ClientResult:
        """The result of a client trained to `state` (any executor): what its step and
        `client_finish` upload, and its persistent state updated with what they keep."""
        upload, kept = step.finish(job.client_state, state, stats, job.sgd)
        own_upload, own_kept = self.client_finish(job, state)
        job.client_state.update(kept)
        job.client_state.update(own_kept)
        return ClientResult(job.client.id, state, job.client.n, stats, {**upload, **own_upload})
