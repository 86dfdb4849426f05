"""`skewavg`: FedAvg whose aggregation weights n_k are damped to n_k * exp(-temperature * skew_k)
(renormalized), skew_k from the `label_skew` stage. With temperature 0 it is FedAvg."""

import math

from fedhet.core.pipeline import StageNode
from fedhet.core.spec import Spec
from fedhet.engine.algorithm import Algorithm, ClientResult
from fedhet.engine.tensors import Tensors
from fedhet.engine.train_plan import train_node
from fedhet_example.plugin import SkewAvgConfig
from fedhet_example.stage import label_skew_node


class SkewAvg(Algorithm):
    name = "skewavg"
    Config = SkewAvgConfig

    @classmethod
    def plan(cls, spec: Spec) -> StageNode:
        # the train stage hands the label_skew artifact over as setup.extras["label_skew"]
        return train_node(spec, label_skew=label_skew_node(spec))

    def aggregate(
        self,
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
        return super().aggregate(global_state, server_state, results, [w / total for w in damped])
