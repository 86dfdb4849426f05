"""What personalized methods share: entries never shared, layers kept on each client, a model of
each client's own trained beside the global one, and fine-tuning at evaluation.

- `PartlyShared`: a trainer whose `unshared_names` never cross the network; the server averages
  the rest and its own copies of those entries never change (FedBABU's head, FedBN's norms).
- `PartlyLocal`: a trainer whose `local_layers` (state-dict prefixes, `parameter_layers`) stay on
  each client, its own entries (`Trainer.own_names`): the engine starts a client from the
  round's global model with its own copy of those layers loaded and keeps them in its client
  state; it sends only the rest, which the server averages as FedAvg does. The server's copies
  of the local layers never change (they are the initial model's: what a client that has never
  trained holds). Each client is evaluated with its own model: the global shared layers and
  its own local ones (FedPer, LG-FedAvg, FedRep, FedRoD).
- `PersonalModels`: a trainer whose clients each keep a model of their own in their client state
  (under a prefix: `stored`, `to_store`), which is what is evaluated (APFL, Ditto, pFedMe).
  `TrainedBeside`: that model takes one step (an `OwnModel`'s) at each of the client's local
  steps, beside its copy of the global model (APFL, Ditto).
- `fine_tune`: k steps of a client's local SGD from a model on the client's training samples, its
  batches drawn from the generator (seed, "finetune", client): the same k steps whenever it is
  asked, so a client's fine-tuned model depends on the model and the client alone (FedAvg-FT,
  FedBABU); `FineTuned`, a trainer whose clients are evaluated with the global model so tuned.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.core.rng import torch_generator
from fedhet.data.clients import ClientData
from fedhet.engine import tensors
from fedhet.engine.local import Divergence, SGDSettings, batch_schedule, local_sgd, sgd
from fedhet.engine.tensors import Tensors
from fedhet.engine.trainer import ClientJob, Trainer


def entries_of(names: Iterable[str], layers: Iterable[str]) -> frozenset[str]:
    """The state-dict names that belong to `layers` (prefixes such as `features.hidden1`)."""
    prefixes = tuple(f"{layer}." for layer in layers)
    return frozenset(name for name in names if name.startswith(prefixes))


class PartlyShared(Trainer):
    """FedAvg of every state entry but `unshared_names`, which never cross the network: the
    server's copies of them never change."""

    @property
    def unshared_names(self) -> frozenset[str]:
        raise NotImplementedError

    def shared(self, state: Tensors) -> Tensors:
        return {k: v for k, v in state.items() if k not in self.unshared_names}

    def aggregate(self, round, global_state, server_state, results, weights) -> Tensors:
        """The shared entries averaged; the server's copies of the others never change."""
        averaged = tensors.weighted_average([self.shared(r.state) for r in results], weights)
        return {k: averaged.get(k, v) for k, v in global_state.items()}


class PartlyLocal(PartlyShared):
    """FedAvg of every state entry but those of `local_layers()`, which stay on each client: its
    own entries (`Trainer.own_names`), which it trains from and keeps."""

    def local_layers(self) -> list[str]:
        """The state-dict prefixes of the layers that stay on the clients."""
        raise NotImplementedError

    @cached_property
    def local_names(self) -> frozenset[str]:
        return entries_of(self.build_model().state_dict(), self.local_layers())

    @property
    def unshared_names(self) -> frozenset[str]:
        return self.local_names

    @property
    def own_names(self) -> frozenset[str]:
        return self.local_names

    def global_model(self, global_state: Tensors) -> Tensors | None:
        """None with local layers (only the clients hold them); else the global model."""
        return None if self.local_names else global_state

    def evaluation_states(
        self, global_state: Tensors, client_states: dict[int, Tensors]
    ) -> list[Tensors]:
        """Each client's own model, in client order; with nothing local, the global model."""
        if not self.local_names or not client_states:
            return [global_state]
        return [self.own_model(global_state, client_states[c]) for c in sorted(client_states)]


def stored(client_state: Tensors, prefix: str) -> Tensors:
    """The model state a client keeps under `prefix` in its client state (empty: none yet)."""
    return {n[len(prefix) :]: v for n, v in client_state.items() if n.startswith(prefix)}


def to_store(state: Tensors, prefix: str) -> Tensors:
    """A copy of the model `state`, its names under `prefix`, for a client state."""
    return {prefix + n: v for n, v in tensors.clone(state).items()}


class PersonalModels(Trainer):
    """A trainer whose clients each keep a model of their own, which is what is evaluated."""

    def personalized(self, global_state: Tensors, client_state: Tensors) -> Tensors:
        """The model a client with this client state is evaluated with."""
        raise NotImplementedError

    def evaluation_states(
        self, global_state: Tensors, client_states: dict[int, Tensors]
    ) -> list[Tensors]:
        """Each given client's personalized model, in client order."""
        own = [self.personalized(global_state, client_states[c]) for c in sorted(client_states)]
        return own or [global_state]


class OwnModel:
    """A client's own model during a round, stepped once at each of its local steps (with the
    federation's local SGD) on the step's batch, at the client's copy of the global model then."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, prefix: str):
        self.model, self.optimizer, self.prefix = model, optimizer, prefix
        self.steps = 0

    def loss(self, w: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The own model's loss on the batch (`w`: the client's copy of the global model)."""
        raise NotImplementedError

    def after_step(self) -> None:
        """What follows the optimizer's step (nothing by default)."""

    def step(self, w: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(w, x, y)
        value = float(loss.detach())
        if not math.isfinite(value):
            raise Divergence(self.steps, value)
        loss.backward()
        self.optimizer.step()
        self.after_step()
        self.steps += 1

    def state(self) -> Tensors:
        """What the client keeps of it: its model state under the prefix."""
        return to_store(self.model.state_dict(), self.prefix)


class TrainedBeside(PersonalModels):
    """Each client's own model (the client context, an `OwnModel`) takes its step at the start
    of each of the client's local steps, before its copy of the global model takes FedAvg's,
    which nothing of the own model reaches; the client keeps it in its client state."""

    vectorizable = False  # its loss steps a second model, the client's own, on each batch

    @cached_property
    def initial_model(self) -> Tensors:
        """Every own model before its client's first round: the initial model."""
        return tensors.clone(self.build_model().to(self.setup.device).state_dict())

    def own_copy(
        self, job: ClientJob, state: Tensors, settings: SGDSettings
    ) -> tuple[nn.Module, torch.optim.SGD]:
        """A model holding `state` and the clients' local SGD of it with `settings`."""
        model = copy.deepcopy(job.model)
        model.load_state_dict(state)
        return model, sgd(model, settings)

    def local_loss(
        self, job: ClientJob, model: nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        job.context.step(model, x, y)
        return super().local_loss(job, model, x, y)

    def client_finish(self, job: ClientJob, state: Tensors) -> tuple[Tensors, Tensors]:
        upload, kept = super().client_finish(job, state)
        return upload, {**kept, **job.context.state()}


def fine_tune(
    trainer: Trainer,
    state: Tensors,
    client: ClientData,
    steps: int,
    lr: float,
    trainable: frozenset[str] | None = None,
) -> Tensors:
    """`state` after `steps` steps of the clients' local SGD (the federation's momentum and
    weight decay, cross-entropy on the dataset's classes) on `client`'s training samples,
    training only the parameters named in `trainable` (default: all); `state` itself with no
    step to take or no sample to take it on."""
    if steps == 0 or client.n == 0:
        return state
    model = trainer.build_model().to(next(iter(state.values())).device)
    model.load_state_dict(state)
    for name, param in model.named_parameters():
        param.requires_grad_(trainable is None or name in trainable)
    spec = trainer.setup.spec
    generator = torch_generator(spec.seed, "finetune", client.id)
    batches = batch_schedule(client.n, trainer.fed.batch_size, steps, generator)
    optimizer = sgd(model, trainer.client_sgd(0, client, lr))
    classes = trainer.setup.dataset.num_classes

    def loss(m, x, y):
        return F.cross_entropy(m(x)[:, :classes], y)

    local_sgd(model, client, batches, optimizer, loss, _nothing, _nothing)
    return tensors.clone(model.state_dict())


class FineTuned(Trainer):
    """Each client is evaluated with the global model fine-tuned on its data: the config's
    `finetune_steps` steps at `finetune_lr` (default: federation.lr) of `fine_tuned_names`."""

    def fine_tuned_names(self) -> frozenset[str] | None:
        """The parameters fine-tuning trains (None: all)."""
        return None

    def evaluation_states(
        self, global_state: Tensors, client_states: dict[int, Tensors]
    ) -> list[Tensors]:
        """The global model fine-tuned on each client's data, in client order."""
        steps, lr = self.config.finetune_steps, self.config.finetune_lr or self.fed.lr
        trainable = self.fine_tuned_names()
        tuned = [
            fine_tune(self, global_state, self.setup.clients[c], steps, lr, trainable)
            for c in sorted(client_states)
        ]
        return tuned or [global_state]


def _nothing(model) -> None:
    pass
