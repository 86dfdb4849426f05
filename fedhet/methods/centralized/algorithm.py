"""Centralized training: the same model on the union of the clients' data.

Each round processes as many samples as a federated round does (local epochs scaled by the
fraction of clients sampled per round), so the number of sample-steps matches.
"""

from typing import Literal

import torch

from fedhet.core.spec import AlgorithmSpec
from fedhet.engine.algorithm import Algorithm, ClientJob, TrainSetup
from fedhet.engine.local import ClientData, num_local_steps
from fedhet.engine.tensors import Tensors


class Centralized(Algorithm):
    name = "centralized"

    class Config(AlgorithmSpec):
        name: Literal["centralized"] = "centralized"

    def __init__(self, config: AlgorithmSpec, setup: TrainSetup):
        super().__init__(config, setup)
        self.fraction = setup.spec.clients_per_round / len(setup.clients)
        union = ClientData(
            0,
            torch.cat([c.x for c in setup.clients]),
            torch.cat([c.y for c in setup.clients]),
        )
        setup.clients = [union]

    def shared(self, state: Tensors) -> Tensors:
        return {}  # one machine holds all the data: nothing crosses a network

    def local_steps(self, job: ClientJob) -> int:
        if self.fed.local_steps is not None:
            per_round = self.setup.spec.clients_per_round
            return self.fed.local_steps * per_round
        return num_local_steps(self.fed, job.client.n, self.fraction)
