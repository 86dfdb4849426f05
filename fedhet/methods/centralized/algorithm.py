"""Centralized training: the same model on the union of the clients' data.

Each round processes as many samples as a federated round does (local epochs scaled by the
fraction of clients sampled per round, among those holding samples), so the number of
sample-steps matches.
"""

import torch

from fedhet.plugin import (
    ClientData,
    ClientJob,
    MethodConfig,
    Tensors,
    Trainer,
    TrainSetup,
    num_local_steps,
)


class Centralized(Trainer):
    def __init__(self, config: MethodConfig, setup: TrainSetup):
        super().__init__(config, setup)
        self.per_round = setup.clients_per_round  # before the clients become their union
        self.fraction = self.per_round / len(setup.holders)
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
            return self.fed.local_steps * self.per_round
        return num_local_steps(self.fed, job.client.n, self.fraction)
