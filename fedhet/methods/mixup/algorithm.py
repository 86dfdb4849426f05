"""FedAvg + Mixup (the `mixup` row of FedBR's Table 1): FedAvg whose clients train each local
step on their batch mixed with itself (Zhang et al., ICLR 2018; the mixing is
fedhet.plugin.Mixer's, shared with FedBR's `mixup` option).

Official code consulted: LINs-lab/FedBR (the code the FedBR authors ran for Table 1),
fedbr/algorithms.py `Mixup.update` and fedbr/lib/misc.py `random_pairs_of_minibatches`: each
client's step holds one minibatch, paired with a shuffled copy of itself; one
lambda ~ Beta(mixup_alpha, mixup_alpha) per step, mixup_alpha = 0.2 (fedbr/hparams_registry.py);
loss lambda CE(f(x~), y) + (1 - lambda) CE(f(x~), y_j). The server is FedAvg's.

Where fedhet differs: lambda is folded to max(lambda, 1 - lambda), which leaves the batch's
loss distributed as before and makes alpha -> 0 exactly FedAvg (fedhet.engine.mixup says why);
lambda and the permutation come from a generator derived from the run's seed, the round and the
client (`mixup`), not numpy's global one. Clients train one at a time: mixing changes the data
term, which the vectorized executor does not state.
"""

from __future__ import annotations

from fedhet.plugin import MixedBatches, Trainer


class MixupTrainer(MixedBatches, Trainer):
    vectorizable = False  # the data term is mixup's, which no client step states
    mixup_stream = "mixup"

    @property
    def mixup_alpha(self) -> float:
        return self.config.alpha
