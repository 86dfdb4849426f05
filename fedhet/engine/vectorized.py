"""Local SGD for a cohort of clients as one batched computation (torch.func).

The sequential path trains one client at a time with small batches, so per-operation overhead
dominates the arithmetic. Here the cohort's parameters are stacked along a leading client dim
and every local step is one `vmap(grad(...))` over the clients: client i takes its own batch
(the indices `batch_schedule` draws from its own generator, so the steps are those of
`local_sgd`), and the optimizer update is torch.optim.SGD's, in the same order (gradient,
algorithm correction, weight decay, momentum, step).

- Different step counts: clients are sorted by steps (most first), so the clients still
  training at step s are a prefix of the chunk and only that prefix is computed
  (`masked=False`); or every client computes every step and a finished client's update is
  masked to zero (`masked=True`). Both give the same results; the benchmark measures them.
- Ragged batches (batch_size not dividing n): batches are padded to batch_size and the loss is
  sum(loss * mask) / count over the client's own samples, the mean `F.cross_entropy` takes.
- Memory: clients train in chunks whose size comes from a memory budget (`chunk_size`).
- Algorithms plug in a `LocalTerm`: a loss term shared by the cohort (FedProx's proximal
  term), a per-client gradient correction (SCAFFOLD's c - c_i), and what a client uploads
  once trained. FedNova needs only each client's step count, which every result carries.

Models whose buffers change in training (BatchNorm's running statistics) cannot run here:
`cannot_vectorize` says why, and such runs stay on the sequential path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from fedhet.engine.local import Divergence, LocalStats, batch_schedule
from fedhet.engine.tensors import Tensors

DEFAULT_BUDGET = 1 << 30  # bytes of working memory for one chunk of clients


@dataclass
class CohortClient:
    """One client's inputs: its data, the index batches of its local steps, and the per-client
    tensors its algorithm's `LocalTerm` needs (e.g. SCAFFOLD's c - c_i), keyed by parameter."""

    x: Tensor
    y: Tensor
    batches: list[Tensor]
    extras: Tensors = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return len(self.batches)


def client_inputs(
    x: Tensor, y: Tensor, steps: int, batch_size: int, generator: torch.Generator
) -> CohortClient:
    """A client's inputs with the batches `local_sgd` would draw from `generator`."""
    return CohortClient(x, y, list(batch_schedule(len(y), batch_size, steps, generator)))


@dataclass(frozen=True)
class SGDSettings:
    """torch.optim.SGD's settings (no dampening, no Nesterov), as `local.sgd` configures it."""

    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0


@dataclass
class CohortResult:
    state: Tensors  # the client's model state after local training
    stats: LocalStats
    upload: Tensors = field(default_factory=dict)
    client_state: Tensors | None = None  # the client's new persistent state (None: unchanged)


class LocalTerm:
    """An algorithm's part of local training; the base class adds nothing (FedAvg, FedNova)."""

    def extras(self, client_state: Tensors) -> Tensors:
        """A client's `CohortClient.extras` from its persistent state."""
        return {}

    def loss(self, params: Tensors) -> Tensor | float:
        """A term added to one client's data loss (`params`: that client's parameters)."""
        return 0.0

    def correct(self, grads: Tensors, extras: Tensors) -> Tensors:
        """Stacked gradients rewritten before the optimizer step (`extras`: stacked alike)."""
        return grads

    def finish(self, client: CohortClient, result: CohortResult, lr: float) -> None:
        """Set what a trained client uploads besides its model and its new persistent state."""


class ProximalTerm(LocalTerm):
    """mu/2 ||w - anchor||^2 added to the loss (FedProx, anchored at the global model)."""

    def __init__(self, mu: float, anchor: Tensors):
        self.mu, self.anchor = mu, anchor

    def loss(self, params: Tensors) -> Tensor | float:
        if self.mu == 0:
            return 0.0
        prox = sum(((p - self.anchor[n]) ** 2).sum() for n, p in params.items())
        return 0.5 * self.mu * prox


class GradientCorrection(LocalTerm):
    """Each client's `extras` added to its gradients before the step (SCAFFOLD's c - c_i)."""

    def correct(self, grads: Tensors, extras: Tensors) -> Tensors:
        return {n: g + extras[n] for n, g in grads.items()}


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
    term: LocalTerm | None = None,
    budget: int = DEFAULT_BUDGET,
    masked: bool = False,
) -> list[CohortResult]:
    """Local SGD of every client from the model state `start`, results in the clients' order.

    `model` only gives the architecture (its own tensors are not used or changed). Raises
    `CohortDivergence` for the first client, in the clients' order, whose loss was not finite.
    """
    reason = cannot_vectorize(model)
    if reason is not None:
        raise ValueError(f"cannot train vectorized: {reason}")
    term = term or LocalTerm()
    batch_size = max(len(b) for c in clients for b in c.batches)
    extras = sum(e.numel() for e in clients[0].extras.values())
    size = chunk_size(model, clients[0].x[0], batch_size, extras, budget)
    order = sorted(range(len(clients)), key=lambda i: -clients[i].steps)
    results: dict[int, CohortResult | Divergence] = {}
    for first in range(0, len(order), size):
        positions = order[first : first + size]
        chunk = _Chunk(model, start, [clients[i] for i in positions], settings, term)
        results.update(zip(positions, chunk.train(masked), strict=True))
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
        term: LocalTerm,
    ):
        self.model, self.start, self.clients = model, start, clients
        self.settings, self.term = settings, term
        names = [n for n, _ in model.named_parameters()]
        self.buffers = {n: start[n] for n, _ in model.named_buffers()}
        count = len(clients)
        self.params = {n: start[n].expand(count, *start[n].shape).clone() for n in names}
        self.extras = {
            n: torch.stack([c.extras[n] for c in clients]) for n in names if n in clients[0].extras
        }
        self.steps = torch.tensor([c.steps for c in clients])
        self._batches()
        self.step = vmap(grad_and_value(self._loss))

    def _batches(self) -> None:
        """x, y: the chunk's data concatenated; index[s, i, j]: the j-th sample of client i's
        batch at step s in them (padding points at the client's first sample, mask 0)."""
        clients = self.clients
        self.x = torch.cat([c.x for c in clients])
        self.y = torch.cat([c.y for c in clients])
        device = self.x.device
        width = max(len(b) for c in clients for b in c.batches)
        offsets = [0]
        for c in clients[:-1]:
            offsets.append(offsets[-1] + len(c.y))
        shape = (max(c.steps for c in clients), len(clients), width)
        index = torch.zeros(shape, dtype=torch.long)
        mask = torch.zeros(shape)
        for i, (client, offset) in enumerate(zip(clients, offsets, strict=True)):
            index[:, i] = offset
            for s, batch in enumerate(client.batches):
                index[s, i, : len(batch)] = batch.cpu() + offset
                mask[s, i, : len(batch)] = 1.0
        self.index, self.mask = index.to(device), mask.to(device)
        self.count = self.mask.sum(-1)  # real samples per (step, client)

    def _loss(self, params: Tensors, x: Tensor, y: Tensor, mask: Tensor, count: Tensor) -> Tensor:
        logits = functional_call(self.model, (params, self.buffers), (x,))
        losses = F.cross_entropy(logits, y, reduction="none")
        return (losses * mask).sum() / count + self.term.loss(params)

    def train(self, masked: bool) -> list[CohortResult | Divergence]:
        settings = self.settings
        momentum = settings.momentum != 0
        buffers = {n: torch.zeros_like(p) for n, p in self.params.items() if momentum}
        total_steps = self.index.shape[0]
        losses = torch.zeros(total_steps, len(self.clients), device=self.x.device)
        for s in range(total_steps):
            active = len(self.clients) if masked else int((self.steps > s).sum())
            params = {n: p[:active] for n, p in self.params.items()}
            idx = self.index[s, :active]
            grads, loss = self.step(
                params, self.x[idx], self.y[idx], self.mask[s, :active], self.count[s, :active]
            )
            losses[s, :active] = loss
            extras = {n: e[:active] for n, e in self.extras.items()}
            grads = self.term.correct(grads, extras)
            keep = (self.steps > s).to(self.x.device) if masked else None
            for name, p in params.items():
                d = grads[name]
                if settings.weight_decay != 0:
                    d = d.add(p, alpha=settings.weight_decay)
                if momentum:
                    buf = buffers[name][:active].mul(settings.momentum).add_(d)
                    buffers[name][:active] = _where(keep, buf, buffers[name][:active])
                    d = buf
                if keep is None:
                    p.add_(d, alpha=-settings.lr)
                else:
                    p.copy_(_where(keep, p.add(d, alpha=-settings.lr), p))
        return self._results(losses)

    def _results(self, losses: Tensor) -> list[CohortResult | Divergence]:
        """Each client's result, or its divergence at its first non-finite loss."""
        losses = losses.double().cpu()
        results: list[CohortResult | Divergence] = []
        for i, client in enumerate(self.clients):
            own = losses[: client.steps, i]
            bad = (~torch.isfinite(own)).nonzero()
            if len(bad):
                step = int(bad[0])
                results.append(Divergence(step, float(own[step])))
                continue
            state = {n: p[i].clone() for n, p in self.params.items()} | {
                n: b.clone() for n, b in self.buffers.items()
            }
            state = {n: state[n] for n in self.start}
            result = CohortResult(state, LocalStats(client.steps, float(own.sum()) / client.steps))
            self.term.finish(client, result, self.settings.lr)
            results.append(result)
        return results


def _where(keep: Tensor | None, new: Tensor, old: Tensor) -> Tensor:
    """`new` for the clients still training (all when `keep` is None), `old` for the rest."""
    if keep is None:
        return new
    return torch.where(keep.view(-1, *[1] * (new.dim() - 1)), new, old)
