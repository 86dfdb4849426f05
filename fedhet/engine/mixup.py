"""Input mixup of a local batch (Zhang et al., ICLR 2018): the one helper of every method whose
clients mix their batches (`mixup`, and FedBR's `mixup` option).

Each batch is mixed with a shuffled copy of itself, as the FedBR authors' Mixup baseline does
(LINs-lab/FedBR, fedbr/algorithms.py `Mixup.update` with one minibatch per client, paired by
fedbr/lib/misc.py `random_pairs_of_minibatches`): one lambda ~ Beta(alpha, alpha) per batch,
a uniform permutation `partner`, inputs lambda x_i + (1 - lambda) x_partner(i), and the loss
lambda CE(f(x~), y) + (1 - lambda) CE(f(x~), y_partner), which equals the cross-entropy with the
mixed soft labels lambda onehot(y_i) + (1 - lambda) onehot(y_partner(i)) (CE is linear in its
target).

fedhet folds lambda to max(lambda, 1 - lambda). That changes no distribution: the batch mixed
with (1 - lambda, partner) is the batch mixed with (lambda, partner^-1), reindexed, and Beta
is symmetric and partner^-1 as uniform as partner, so the multiset of mixed samples, hence the
batch's loss, is distributed as without folding. What it buys is the limit: as alpha -> 0,
lambda -> 0 or 1, folded to 1, and the mixed batch is the batch itself (1 * x + 0 * x_j == x,
1 * CE + 0 * CE == CE), so training is FedAvg's to the bit, where lambda = 0 would train on
the batch in a shuffled order (the same mean, rounded differently).

Draws come from a numpy Generator seeded by the caller (`derive_seed(spec.seed, ...)`), apart
from the batch schedule's generator, so mixing never shifts which samples a step draws.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedhet.core.rng import derive_seed


@dataclass(frozen=True)
class Mixup:
    """One batch's mixup: weight `lam` of each sample, `partner[i]` the sample mixed into i."""

    lam: float
    partner: torch.Tensor

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """lam x_i + (1 - lam) x_partner(i)."""
        return self.lam * x + (1 - self.lam) * x[self.partner]

    def labels(self, y: torch.Tensor, num_classes: int) -> torch.Tensor:
        """The mixed soft labels, lam onehot(y_i) + (1 - lam) onehot(y_partner(i))."""
        onehot = F.one_hot(y, num_classes).float()
        return self.lam * onehot + (1 - self.lam) * onehot[self.partner]

    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """lam CE(logits, y) + (1 - lam) CE(logits, y_partner): the cross-entropy with `labels`,
        in the official code's form (with lam = 1 it is CE(logits, y) to the bit)."""
        ce = F.cross_entropy(logits, y)
        return self.lam * ce + (1 - self.lam) * F.cross_entropy(logits, y[self.partner])


class Mixer:
    """Draws each batch's `Mixup` in turn: lambda ~ Beta(alpha, alpha), folded to
    max(lambda, 1 - lambda), and a uniform permutation, from a generator seeded by `seed`."""

    def __init__(self, alpha: float, seed: int):
        if not alpha > 0:
            raise ValueError(f"mixup alpha must be > 0, got {alpha}")
        self.alpha = alpha
        self.rng = np.random.default_rng(seed)

    def draw(self, n: int, device: torch.device | str = "cpu") -> Mixup:
        lam = float(self.rng.beta(self.alpha, self.alpha))
        partner = torch.from_numpy(self.rng.permutation(n)).to(device)
        return Mixup(max(lam, 1.0 - lam), partner)


class MixedBatches:
    """A trainer mixin: each client mixes every local batch with itself, one seeded `Mixer` per
    client and round (its job's context). The trainer names the stream its draws come from
    (`mixup_stream`) and the Beta parameter (`mixup_alpha`)."""

    mixup_stream: str

    @property
    def mixup_alpha(self) -> float:
        raise NotImplementedError

    def client_context(self, job) -> Mixer:
        """The client's mixup draws for the round."""
        seed = derive_seed(self.setup.spec.seed, self.mixup_stream, job.round, job.client.id)
        return Mixer(self.mixup_alpha, seed)

    def local_loss(self, job, model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        mix = job.context.draw(len(y), x.device)
        return mix.loss(model(mix.inputs(x)), y)
