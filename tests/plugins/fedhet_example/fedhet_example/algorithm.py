"""`skewavg`: FedAvg whose aggregation weights n_k are damped to n_k * exp(-temperature * skew_k)
(renormalized), skew_k from the `label_skew` stage. With temperature 0 it is FedAvg."""

import math

from fedhet.plugin import ClientResult, Tensors, Trainer


class SkewAvg(Trainer):
    def aggregate(
        self,
        round: int,
        global_state: Tensors,
        server_state: Tensors,
        results: list[ClientResult],
        weights: list[float],
    ) -> Tensors:
        skew = self.setup.extras["label_skew"]["skew"][:]
        damped = [
            w * math.exp(-self.config.temperature * skew[r.client])
            for r, w in zip(results, weights, strict=True)
        ]
        total = sum(damped)
        damped = [w / total for w in damped]
        return super().aggregate(round, global_state, server_state, results, damped)
