"""A method's part of a client's local SGD, written once for every client executor.

A `ClientStep` is stated over a cohort of clients: every tensor it sees carries a leading client
dim, parameters and gradients stacked over the clients that train together. The sequential
executor runs it as a cohort of one (`OneClient`, views of one model's own tensors), the
vectorized executor (fedhet.engine.vectorized) as the round's cohort; both apply its hooks in
the order of torch.optim.SGD's step:

    loss = data loss + step.client_loss(params, extras)   each client's loss, [clients]
                                                  (by default step.loss(params))
    grads = step.correct(grads, extras, params)   before the optimizer step
    optimizer step (weight decay, momentum)
    step.after_step(params, extras, lr)           after it
    ...
    upload, kept = step.finish(client_state, state, stats, sgd)   once trained

FedProx's whole client step is `Proximal` below: a loss term, mu/2 ||w - anchor||^2.
The base class adds nothing: FedAvg's step, and FedNova's (which needs only each client's step
count, in every result). The fused executor (fedhet.engine.fused), which derives an MLP's
gradients by hand, runs two client steps, whose hooks in `LOCAL_SGD_HOOKS` it knows in closed
form: the base class and `Proximal` (FedProx's, its gradient mu (w - anchor) folded into the
step like weight decay toward the anchor).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from torch import Tensor, nn

from fedhet.engine.local import LocalStats, SGDSettings
from fedhet.engine.tensors import Tensors

Stacked = Mapping[str, Tensor]  # name -> a tensor with a leading client dim

LOCAL_SGD_HOOKS = ("extras", "loss", "client_loss", "correct", "after_step")  # the hooks inside it


class ClientStep:
    """One round's client step (`Trainer.client_step`); the hooks below are its whole say in
    local training."""

    def extras(self, client_state: Tensors) -> Tensors:
        """The client's own tensors that `correct` and `after_step` read, by parameter name, from
        its persistent state (e.g. SCAFFOLD's c - c_i); `client_loss` may also read tensors
        under names no parameter has (e.g. a per-client scalar)."""
        return {}

    def loss(self, params: Stacked) -> Tensor | None:
        """Each client's term added to its data loss, [clients] (`params` stacked); None adds
        nothing."""
        return None

    def client_loss(self, params: Stacked, extras: Stacked) -> Tensor | None:
        """The term when it reads the clients' own `extras` (stacked alike; FedDyn's linear
        term and per-client coefficient); by default `loss`, which reads none."""
        return self.loss(params)

    def correct(self, grads: Stacked, extras: Stacked, params: Stacked) -> Stacked:
        """The stacked gradients rewritten before the optimizer step (`extras` and the current
        parameters `params` stacked alike, to read, not to change; a parameter without a
        gradient is absent from `grads`)."""
        return grads

    def after_step(self, params: Stacked, extras: Stacked, lr: float) -> None:
        """Rewrite the stacked parameters in place after each optimizer step."""

    def finish(
        self, client_state: Tensors, state: Tensors, stats: LocalStats, sgd: SGDSettings
    ) -> tuple[Tensors, Tensors]:
        """(upload, kept) once a client has trained to model `state` with its local optimizer
        `sgd`: the tensors it sends the server besides its model, and the entries its persistent
        state takes on."""
        return {}, {}


class Proximal(ClientStep):
    """mu/2 ||w - anchor||^2 added to each client's loss, anchored at the round's global model."""

    def __init__(self, mu: float, anchor: Tensors):
        self.mu, self.anchor = mu, anchor

    def loss(self, params: Stacked) -> Tensor | None:
        if self.mu == 0:
            return None
        prox = sum(((p - self.anchor[n]) ** 2).flatten(1).sum(1) for n, p in params.items())
        return 0.5 * self.mu * prox


class OneClient:
    """A client step applied to one model as a cohort of one: its parameters, gradients and the
    client's extras seen with a leading client dim of 1 (views of the model's own tensors,
    made when the step reads them)."""

    def __init__(self, step: ClientStep, model: nn.Module, extras: Tensors, lr: float):
        self.step, self.lr = step, lr
        self.params = dict(model.named_parameters())
        self.data = {n: p.detach() for n, p in self.params.items()}  # what after_step rewrites
        self.extras = {n: e.unsqueeze(0) for n, e in extras.items()}

    def loss(self, data_loss: Tensor) -> Tensor:
        """The client's loss: the data term plus the step's."""
        term = self.step.client_loss(_CohortOfOne(self.params), self.extras)
        return data_loss if term is None else data_loss + term[0]

    def before_step(self, model: nn.Module) -> None:
        grads = _CohortOfOne({n: p.grad for n, p in self.params.items() if p.grad is not None})
        corrected = self.step.correct(grads, self.extras, _CohortOfOne(self.data))
        if corrected is not grads:
            for name, grad in corrected.items():
                self.params[name].grad = grad[0]

    def after_step(self, model: nn.Module) -> None:
        self.step.after_step(_CohortOfOne(self.data), self.extras, self.lr)


class _CohortOfOne(Mapping[str, Tensor]):
    """Tensors read with a leading client dim of 1 (a view, made on each read)."""

    def __init__(self, tensors: Tensors):
        self.tensors = tensors

    def __getitem__(self, name: str) -> Tensor:
        return self.tensors[name].unsqueeze(0)

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)
