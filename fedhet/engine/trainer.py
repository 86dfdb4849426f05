"""The trainer: the federated training of a method. The base class is FedAvg; every method's
trainer overrides only what differs. (What a method plans before training is its config's,
fedhet.engine.description.MethodConfig.)

A trainer is a few functions over explicit state:
- `init_server_state(global_state)`: extra server-side tensors (e.g. SCAFFOLD's control);
- `client_update(job)`: local training from the global state, returning a `ClientResult`;
- `aggregate(round, global_state, server_state, results, weights)`: the new global state;
- hooks: `local_loss` (the local objective), `before_step` (gradient rewriting), `after_step`
  (parameter rewriting after each optimizer step),
  `synchronized_first_step` (a lockstep step across the round's clients, returning the
  `Traffic` it adds), `download`/`shared` (what crosses the network, for accounting),
  `evaluation_states` (personalized models to evaluate) and `build_model`;
- `vectorized_term(jobs)`: the trainer's part of local training when the round's clients train
  as one batched computation (`fedhet.engine.vectorized`); None where it cannot.
The engine owns the round loop, sampling, evaluation, metrics and checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import nn

from fedhet.data.clients import ClientData
from fedhet.engine import momentum_buffers, objectives, tensors
from fedhet.engine.description import MethodConfig
from fedhet.engine.local import LocalStats, batch_schedule, local_sgd, sgd
from fedhet.engine.setup import TrainSetup
from fedhet.engine.tensors import Tensors
from fedhet.engine.vectorized import LocalTerm

# The client-side hooks a `vectorized_term` must stand for: a trainer that overrides one of them
# below the class defining its `vectorized_term` trains sequentially.
CLIENT_HOOKS = ("client_update", "local_loss", "before_step", "after_step")


@dataclass
class ClientJob:
    """One client's work in one round."""

    round: int
    client: ClientData
    model: nn.Module  # loaded with the global state
    global_state: Tensors
    server_state: Tensors
    client_state: Tensors  # persists across rounds for this client (e.g. control variates)
    lr: float
    generator: torch.Generator
    steps: int  # local steps this round (fedhet.engine.system: the federation's, or drawn)
    first_step: Callable[[nn.Module], torch.Tensor] | None = None


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

    # --- client side --------------------------------------------------------------------

    def local_loss(
        self, job: ClientJob, model: nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        return self.objective.loss(model, x, y, job.generator)

    def before_step(self, job: ClientJob, model: nn.Module) -> None:
        """Rewrite gradients after backward, before the optimizer step."""

    def after_step(self, job: ClientJob, model: nn.Module) -> None:
        """Rewrite parameters after each optimizer step."""

    def local_steps(self, job: ClientJob) -> int:
        return job.steps

    def client_batches(self, job: ClientJob):
        return batch_schedule(
            job.client.n, self.fed.batch_size, self.local_steps(job), job.generator
        )

    def vectorized_term(self, jobs: list[ClientJob]) -> LocalTerm | None:
        """The round's local training as a `LocalTerm` (FedAvg's adds nothing), for the
        vectorized executor; None: this trainer's clients train one at a time."""
        return LocalTerm()

    def client_update(self, job: ClientJob) -> ClientResult:
        model = job.model
        optimizer = sgd(model, job.lr, self.momentum, self.fed)
        carried = 0.0
        if self.keeps_buffers:
            carried = momentum_buffers.restore(optimizer, model, job.client_state)
        stats = local_sgd(
            model,
            job.client,
            self.client_batches(job),
            optimizer,
            lambda m, x, y: self.local_loss(job, m, x, y),
            before_step=lambda m: self.before_step(job, m),
            first_step=job.first_step,
            after_step=lambda m: self.after_step(job, m),
        )
        if self.keeps_buffers:
            momentum_buffers.keep(optimizer, model, job.client_state, stats.steps, carried)
            stats.carried = carried
        return ClientResult(job.client.id, tensors.clone(model.state_dict()), job.client.n, stats)
