"""Local SGD for a cohort of clients as one batched computation.

The sequential path trains one client at a time with small batches, so per-operation overhead
dominates the arithmetic. Here the cohort's parameters are stacked along a leading client dim
and every local step computes every active client's gradient at once: client i takes its own
batch (the indices `batch_schedule` draws from its own generator, so the steps are those of
`local_sgd`), and the update is torch.optim.SGD's own (`torch.optim.sgd.sgd`, the multi-tensor
form) on the stacked parameters, in the same order (gradient, the client step's correction,
weight decay, momentum, step, the client step's correction after it).

- How the gradients are computed depends on the model (fedhet.engine.cohort_gradients):
  batched matmuls for a chain of Linear, ReLU and Flatten layers (the MLP), vmap otherwise.
- Different step counts: clients are sorted by steps (most first), so the clients still
  training at step s are a prefix of the chunk and only that prefix is computed.
- Ragged batches (batch_size not dividing n): batches are padded to batch_size and the loss is
  sum(loss * mask) / count over the client's own samples, the mean `F.cross_entropy` takes.
- Different starts: a client may start from a model state of its own (`CohortClient.start`: a
  personalized method's own layers); the cohort's parameters are stacked from each client's.
  The buffers a forward pass reads are the cohort's `start`'s: no model that trains here
  changes its buffers, so they are every client's.
- Memory: clients train in chunks whose size comes from a memory budget (`chunk_size`).
- A method's part is its `ClientStep` (fedhet.engine.client_step), the one the sequential path
  runs for a cohort of one: here its hooks see the chunk's stacked tensors.

Models whose buffers change in training (BatchNorm's running statistics) cannot run here:
`cannot_vectorize` says why, and such runs stay on the sequential path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.optim.sgd import sgd

from fedhet.data.clients import take_rows
from fedhet.engine.client_step import ClientStep
from fedhet.engine.cohort_gradients import CohortBatch, Gradients, cohort_gradients
from fedhet.engine.local import Divergence, LocalStats, SGDSettings, batch_schedule
from fedhet.engine.tensors import Tensors

DEFAULT_BUDGET = 1 << 30  # bytes of working memory for one chunk of clients


@dataclass
class CohortClient:
    """One client's inputs: its data, the index batches of its local steps, its extras for
    the client step (`ClientStep.extras`, e.g. SCAFFOLD's c - c_i), keyed by parameter (and
    names no parameter has, which only `ClientStep.client_loss` reads), and the model state it
    starts from when that is its own (`Trainer.client_start`; None: the cohort's)."""

    x: Tensor
    y: Tensor
    batches: list[Tensor]
    extras: Tensors = field(default_factory=dict)
    start: Tensors | None = None

    @property
    def steps(self) -> int:
        return len(self.batches)


def client_inputs(
    x: Tensor, y: Tensor, steps: int, batch_size: int, generator: torch.Generator
) -> CohortClient:
    """A client's inputs with the batches `local_sgd` would draw from `generator`."""
    return CohortClient(x, y, list(batch_schedule(len(y), batch_size, steps, generator)))


@dataclass
class CohortResult:
    state: Tensors  # the client's model state after local training
    stats: LocalStats


def cannot_vectorize(model: nn.Module) -> str | None:
    """Why `model` cannot train here (None: it can)."""
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return "BatchNorm updates running statistics during training"
    return None


def chunk_size(
    model: nn.Module, sample: Tensor, batch_size: int, extras: int, budget: int = DEFAULT_BUDGET
) -> int:
    """How many clients fit a memory budget of `budget` bytes.

    A client holds its parameters, gradients, updated parameters and momentum buffer, its
    `extras` (elements), and a batch's activations, counted as three times (forward outputs,
    saved tensors, their gradients) the outputs of every module for `sample`.
    """
    params = sum(p.numel() for p in model.parameters())
    activations = 0

    def count(module: nn.Module, inputs: object, output: object) -> None:
        nonlocal activations
        if isinstance(output, Tensor):
            activations += output.numel()

    handles = [m.register_forward_hook(count) for m in model.modules()]
    try:
        with torch.no_grad():
            model(sample.unsqueeze(0))
    finally:
        for handle in handles:
            handle.remove()
    per_client = 4 * (4 * params + extras + 3 * batch_size * (activations + sample.numel()))
    return max(1, budget // per_client)


def train_cohort(
    model: nn.Module,
    start: Tensors,
    clients: Sequence[CohortClient],
    settings: SGDSettings,
    step: ClientStep | None = None,
    budget: int = DEFAULT_BUDGET,
) -> list[CohortResult]:
    """Local SGD of every client from the model state `start` (or its own, `CohortClient.start`),
    results in the clients' order.

    `model` only gives the architecture (its own tensors are not used or changed). Raises
    `CohortDivergence` for the first client, in the clients' order, whose loss was not finite.
    """
    reason = cannot_vectorize(model)
    if reason is not None:
        raise ValueError(f"cannot train vectorized: {reason}")
    step = step or ClientStep()
    batch_size = max(len(b) for c in clients for b in c.batches)
    extras = sum(e.numel() for e in clients[0].extras.values())
    size = chunk_size(model, clients[0].x[0], batch_size, extras, budget)
    gradients = cohort_gradients(model, start, clients[0].x[0], step)
    order = sorted(range(len(clients)), key=lambda i: -clients[i].steps)
    results: dict[int, CohortResult | Divergence] = {}
    for first in range(0, len(order), size):
        positions = order[first : first + size]
        chunk = _Chunk(model, start, [clients[i] for i in positions], settings, step, gradients)
        results.update(zip(positions, chunk.train(), strict=True))
    for position in range(len(clients)):
        if isinstance(results[position], Divergence):
            raise CohortDivergence(position, results[position])
    return [results[i] for i in range(len(clients))]


class CohortDivergence(Exception):
    """Client `position` (in the cohort's order) diverged."""

    def __init__(self, position: int, divergence: Divergence):
        super().__init__(f"client {position} of the cohort: {divergence}")
        self.position, self.divergence = position, divergence


class _Chunk:
    """Clients sorted by steps (most first) trained together; their batches as index tensors."""

    def __init__(
        self,
        model: nn.Module,
        start: Tensors,
        clients: list[CohortClient],
        settings: SGDSettings,
        step: ClientStep,
        gradients: Gradients,
    ):
        self.clients = clients
        self.starts = [start if client.start is None else client.start for client in clients]
        self.settings, self.step, self.gradients = settings, step, gradients
        names = [n for n, _ in model.named_parameters()]
        self.buffer_names = [n for n, _ in model.named_buffers()]
        self.params = {
            n: gradients.layout(n, torch.stack([own[n] for own in self.starts])) for n in names
        }
        self.extras = {  # parameters' extras first, in the parameters' order
            n: gradients.layout(n, torch.stack([c.extras[n] for c in clients]))
            for n in [*names, *(n for n in clients[0].extras if n not in names)]
            if n in clients[0].extras
        }
        self._batches()

    def _batches(self) -> None:
        """x, y: the chunk's data concatenated; index[s, i, j]: the j-th sample of client i's
        batch at step s in them (padding points at the client's first sample, mask 0)."""
        clients = self.clients
        self.x = torch.cat([c.x for c in clients])
        self.y = torch.cat([c.y for c in clients])
        device = self.x.device
        width = max(len(b) for c in clients for b in c.batches)
        shape = (max(c.steps for c in clients), len(clients), width)
        sizes = torch.tensor([len(c.y) for c in clients])
        offsets = sizes.cumsum(0) - sizes
        index = offsets.view(1, -1, 1).expand(shape).clone()
        mask = torch.zeros(shape)
        # every batch's samples written at once: batch s of client i fills row s * clients + i
        rows = [
            (s * len(clients) + i, b)
            for i, c in enumerate(clients)
            for s, b in enumerate(c.batches)
        ]
        lengths = torch.tensor([len(b) for _, b in rows])
        row = torch.tensor([r for r, _ in rows]).repeat_interleave(lengths)
        first = (lengths.cumsum(0) - lengths).repeat_interleave(lengths)
        slots = row * width + torch.arange(len(row)) - first
        index.view(-1)[slots] = torch.cat([b for _, b in rows]).cpu() + offsets[row % len(clients)]
        mask.view(-1)[slots] = 1.0
        self.index, self.mask = index.to(device), mask.to(device)
        self.count = self.mask.sum(-1)  # real samples per (step, client)

    def train(self) -> list[CohortResult | Divergence]:
        settings = self.settings
        names = list(self.params)
        # zero buffers: torch's first momentum step (a clone of the gradient) to the bit
        momentum = [
            torch.zeros_like(p) if settings.momentum else None for p in self.params.values()
        ]
        losses = torch.zeros(self.index.shape[0], len(self.clients), device=self.x.device)
        for s in range(self.index.shape[0]):
            active = sum(c.steps > s for c in self.clients)
            params = {n: p[:active] for n, p in self.params.items()}
            idx = self.index[s, :active]
            extras = {n: e[:active] for n, e in self.extras.items()}
            batch = CohortBatch(
                take_rows(self.x, idx),
                take_rows(self.y, idx),
                self.mask[s, :active],
                self.count[s, :active],
                extras,
            )
            grads, loss = self.gradients(params, batch)
            losses[s, :active] = loss
            grads = self.step.correct(grads, extras, params)
            sgd(
                list(params.values()),
                [grads[n] for n in names],
                [b if b is None else b[:active] for b in momentum],
                foreach=True,
                weight_decay=settings.weight_decay,
                momentum=settings.momentum,
                lr=settings.lr,
                dampening=0.0,
                nesterov=False,
                maximize=False,
            )
            self.step.after_step(params, extras, settings.lr)
        return self._results(losses)

    def _results(self, losses: Tensor) -> list[CohortResult | Divergence]:
        """Each client's result, or its divergence at its first non-finite loss."""
        losses = losses.double().cpu()
        # the chunk's own tensors, contiguous (a copy when laid out otherwise): client i's
        # parameters are views of them, no other client's
        params = {n: p.contiguous() for n, p in self.params.items()}
        results: list[CohortResult | Divergence] = []
        for i, (client, start) in enumerate(zip(self.clients, self.starts, strict=True)):
            own = losses[: client.steps, i]
            bad = (~torch.isfinite(own)).nonzero()
            if len(bad):
                step = int(bad[0])
                results.append(Divergence(step, float(own[step])))
                continue
            state = {n: p[i] for n, p in params.items()} | {
                n: start[n].clone() for n in self.buffer_names
            }
            state = {n: state[n] for n in start}
            stats = LocalStats(client.steps, float(own.sum()) / client.steps)
            stats.first_loss = float(own[0])
            results.append(CohortResult(state, stats))
        return results
