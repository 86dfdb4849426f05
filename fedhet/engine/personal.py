"""What personalized methods share: layers kept on each client, and fine-tuning at evaluation.

- `PartlyLocal`: a trainer whose `local_layers` (state-dict prefixes, `parameter_layers`) stay on
  each client: a client trains from the round's global model with its own copy of those layers
  loaded, keeps them in its client state, and sends only the rest, which the server averages as
  FedAvg does. The server's copies of the local layers never change (they are the initial
  model's: what a client that has never trained holds). Each client is evaluated with its own
  model: the global shared layers and its own local ones (FedPer, LG-FedAvg, FedRep, FedRoD).
- `fine_tune`: k steps of a client's local SGD from a model on the client's training samples, its
  batches drawn from the generator (seed, "finetune", client): the same k steps whenever it is
  asked, so a client's fine-tuned model depends on the model and the client alone (FedAvg-FT,
  FedBABU).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cached_property

import torch.nn.functional as F

from fedhet.core.rng import torch_generator
from fedhet.data.clients import ClientData
from fedhet.engine import tensors
from fedhet.engine.local import batch_schedule, local_sgd, sgd
from fedhet.engine.tensors import Tensors
from fedhet.engine.trainer import ClientJob, ClientResult, Trainer


def entries_of(names: Iterable[str], layers: Iterable[str]) -> frozenset[str]:
    """The state-dict names that belong to `layers` (prefixes such as `features.hidden1`)."""
    prefixes = tuple(f"{layer}." for layer in layers)
    return frozenset(name for name in names if name.startswith(prefixes))


class PartlyLocal(Trainer):
    """FedAvg of every state entry but those of `local_layers()`, which stay on each client."""

    vectorizable = False  # each client starts from its own local layers

    def local_layers(self) -> list[str]:
        """The state-dict prefixes of the layers that stay on the clients."""
        raise NotImplementedError

    @cached_property
    def local_names(self) -> frozenset[str]:
        return entries_of(self.build_model().state_dict(), self.local_layers())

    def shared(self, state: Tensors) -> Tensors:
        return {k: v for k, v in state.items() if k not in self.local_names}

    def own_model(self, global_state: Tensors, client_state: Tensors) -> Tensors:
        """The client's model: the global shared entries and its own local ones (the server's
        copies, the initial model's, before its first round)."""
        return {
            k: client_state.get(k, v) if k in self.local_names else v
            for k, v in global_state.items()
        }

    def client_update(self, job: ClientJob) -> ClientResult:
        job.model.load_state_dict(self.own_model(job.global_state, job.client_state))
        result = self.train_locally(job)
        job.client_state.update({k: result.state[k].clone() for k in self.local_names})
        return result

    def train_locally(self, job: ClientJob) -> ClientResult:
        """The client's local training from its own model (FedAvg's local SGD by default)."""
        return super().client_update(job)

    def aggregate(self, round, global_state, server_state, results, weights) -> Tensors:
        """The shared entries averaged; the server's copies of the local ones never change."""
        averaged = tensors.weighted_average([self.shared(r.state) for r in results], weights)
        return {k: averaged.get(k, v) for k, v in global_state.items()}

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
    optimizer = sgd(model, lr, trainer.momentum, trainer.fed)
    classes = trainer.setup.dataset.num_classes

    def loss(m, x, y):
        return F.cross_entropy(m(x)[:, :classes], y)

    local_sgd(model, client, batches, optimizer, loss, _nothing, _nothing)
    return tensors.clone(model.state_dict())


def _nothing(model) -> None:
    pass
