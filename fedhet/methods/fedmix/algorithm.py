"""FedMix (Yoon et al., ICLR 2021, "FedMix: Approximation of Mixup under Mean Augmented Federated
Learning"): the `fedmix` row of FedBR's Table 1.

Mean augmented FL (MAFL): before training, each client averages its data over groups of M
samples (images, and one-hot labels into class frequencies) and uploads these means once; the
server collects them and sends each client the other clients' means. At every local step,
client i's batch (x, y) of size B is paired with B means (x_bar, y_bar) drawn from those, and
its loss is the first-order approximation of global mixup with weight lambda:

    (1/B) sum_i [ (1 - lam) l(f(z_i), y_i) + lam l(f(z_i), y_bar_i) + lam <g_i, x_bar_i> ],
    z_i = (1 - lam) x_i,

l the cross-entropy (soft labels y_bar), and g the derivative with respect to the scaled input
z of the first term, (1 - lam) l(f(z), y) (the exact first-order coefficient lam (1 - lam) of
the y_i part of the mixed loss). The server is FedAvg's.

Official code consulted: LINs-lab/FedBR (what the FedBR authors ran for Table 1),
fedbr/algorithms.py `FedMix.update` and fedbr/scripts/train_fed.py
`get_augmentation_fedmix_data`. fedhet follows it for:
- lambda = 0.1 (hard-coded there) and M = 10 (the function's default);
- the loss: loss1 = (1 - lam) CE(f(z), y) (batch mean), loss2 the soft-label CE with y_bar
  times lam, and g = autograd.grad(loss1, z), i.e. the derivative of the batch MEAN of the first
  term, so the Taylor term carries an extra 1/B against the paper's per-sample formula. That is
  the default here (`derivative: batch_mean`, as Flower's FedMix baseline does too);
  `derivative: sample` differentiates each sample's own first term (the paper's formula read
  per sample);
- B means per step, one per sample of the batch, each from a client drawn uniformly (not by
  data size), then a mean of that client.

Where fedhet differs from that code, and why:
- The code recomputes, at every step, fresh means of M samples drawn with replacement from the
  raw data of a client drawn among ALL clients, the training client included. That needs every
  client's raw data at every step, which MAFL exists to avoid; fedhet implements the protocol
  of the paper (and of fedhet's issue): means of disjoint groups of M samples (a seeded shuffle
  of the client's data cut into floor(n / M) groups; the n mod M left over are not shared, so
  no mean averages fewer than M samples), exchanged once, and a client draws only from the
  OTHER clients' means. A client with fewer than M samples shares nothing (it still trains).
- Draws come from generators derived from the run's seed: the groups from
  (`fedmix-means`, client), a step's means from (`fedmix`, round, client).
- Traffic: the exchange is counted once, in round 0: every holder's means up, each holder's
  share of the others' means down, and one extra round trip (fedhet.plugin.Traffic).
With BatchNorm in training mode the samples of a batch are coupled, so g is the batch's total
derivative, as in the official code. Clients train one at a time (the loss needs a second
derivative, which the vectorized executor does not state).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.plugin import (
    ClientJob,
    RunError,
    Traffic,
    Trainer,
    tensors,
    torch_generator,
)


@dataclass
class Means:
    """A client's shared means: `x` [G, ...] images, `y` [G, classes] class frequencies, and
    `members` [G, M]: the indices of the client's samples each mean averages (kept locally)."""

    x: torch.Tensor
    y: torch.Tensor
    members: torch.Tensor

    def shared(self) -> dict[str, torch.Tensor]:
        """What crosses the network (the members never do)."""
        return {"x": self.x, "y": self.y}


def group_means(
    x: torch.Tensor, y: torch.Tensor, num_classes: int, size: int, gen: torch.Generator
) -> Means:
    """The means of floor(n / size) disjoint groups of `size` samples: the client's samples in a
    seeded random order, cut into consecutive groups (the rest left out)."""
    groups = len(y) // size
    order = torch.randperm(len(y), generator=gen)[: groups * size].view(groups, size)
    members = order.to(y.device)
    onehot = F.one_hot(y[members], num_classes).to(x.dtype)
    return Means(x[members].mean(1), onehot.mean(1), order)


class MeanPool:
    """Every client's means, as the server collects them. A client's draw takes, for each of its
    samples, one of the OTHER clients holding means uniformly, then one of its means uniformly."""

    def __init__(self, means: dict[int, Means]):
        self.clients = list(means)
        self.x = torch.cat([m.x for m in means.values()])
        self.y = torch.cat([m.y for m in means.values()])
        self.counts = torch.tensor([len(m.y) for m in means.values()])
        self.offsets = self.counts.cumsum(0) - self.counts

    def sources(self, client: int) -> torch.Tensor:
        """The positions of the clients whose means `client` draws from."""
        return torch.tensor(
            [i for i, cid in enumerate(self.clients) if cid != client and self.counts[i] > 0],
            dtype=torch.long,
        )

    def draw(
        self, sources: torch.Tensor, count: int, gen: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`count` means (x_bar, y_bar) of the clients at positions `sources` (`sources()`)."""
        source = sources[torch.randint(len(sources), (count,), generator=gen)]
        within = torch.rand(count, generator=gen, dtype=torch.float64) * self.counts[source]
        index = (self.offsets[source] + within.long()).to(self.x.device)
        return self.x[index], self.y[index]


@dataclass(frozen=True)
class MeanDraws:
    """A client's draws of means in one round: the pool positions it draws from, and the
    generator of its draws."""

    sources: torch.Tensor
    generator: torch.Generator


def fedmix_loss(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    x_bar: torch.Tensor,
    y_bar: torch.Tensor,
    lam: float,
    derivative: str = "batch_mean",
) -> torch.Tensor:
    """FedMix's approximate mixup loss of the batch (x, y) with the means (x_bar, y_bar), one
    per sample (the module's docstring states it); differentiable in the model's parameters."""
    z = ((1 - lam) * x).detach().requires_grad_()
    logits = model(z)
    first = (1 - lam) * F.cross_entropy(logits, y, reduction="none")
    second = -lam * (F.log_softmax(logits, 1) * y_bar).sum(1)
    differentiated = first.mean() if derivative == "batch_mean" else first.sum()
    (g,) = torch.autograd.grad(differentiated, z, create_graph=True)
    taylor = lam * (g * x_bar).flatten(1).sum(1)
    return (first + second + taylor).mean()


class FedMix(Trainer):
    vectorizable = False  # its data term needs a second derivative, which no client step states

    @cached_property
    def means(self) -> dict[int, Means]:
        """Every holder's means, computed once before training."""
        setup, size = self.setup, self.config.mean_size
        classes = setup.dataset.num_classes
        return {
            cid: group_means(
                setup.clients[cid].x,
                setup.clients[cid].y,
                classes,
                size,
                torch_generator(setup.spec.seed, "fedmix-means", cid),
            )
            for cid in setup.holders
        }

    @cached_property
    def pool(self) -> MeanPool:
        return MeanPool(self.means)

    def sources(self, client: int) -> torch.Tensor:
        """The positions in `pool` of the clients `client` draws from (refused if none)."""
        sources = self.pool.sources(client)
        if len(sources) == 0:
            raise RunError(
                f"fedmix: client {client} receives no mean: no other client holds "
                f"algorithm.mean_size={self.config.mean_size} samples; lower it"
            )
        return sources

    def synchronized_first_step(
        self, round: int, model: nn.Module, jobs: list[ClientJob], weights: list[float]
    ) -> Traffic:
        """Round 0 also carries the one-off exchange of means: each holder uploads its own and
        receives the others'."""
        traffic = super().synchronized_first_step(round, model, jobs, weights)
        if round != 0:
            return traffic
        sizes = [tensors.nbytes(m.shared()) for m in self.means.values()]
        up = sum(sizes)
        down = sum(up - own for own in sizes)
        return Traffic(traffic.bytes_up + up, traffic.bytes_down + down, traffic.rounds + 1)

    def client_context(self, job: ClientJob) -> MeanDraws:
        """The means the client mixes with this round, and their seeded draws."""
        draws = torch_generator(self.setup.spec.seed, "fedmix", job.round, job.client.id)
        return MeanDraws(self.sources(job.client.id), draws)

    def local_loss(
        self, job: ClientJob, model: nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        x_bar, y_bar = self.pool.draw(job.context.sources, len(y), job.context.generator)
        cfg = self.config
        return fedmix_loss(model, x, y, x_bar, y_bar, cfg.lam, cfg.derivative)
