"""`fedrep`: Exploiting Shared Representations for Personalized FL (Collins et al., 2021).

Each round a sampled client first trains its own head with the representation (the body)
frozen, then the body with its head frozen; only the body is sent and averaged, the head stays
on the client (Algorithm 1). The official code (lgcollins/FedRep, models/Update.py) runs
`local_ep` epochs of which the first `local_ep - local_rep_ep` train the head only and the last
`local_rep_ep` the body only (defaults 10 and 1: 9 head epochs, then 1 body epoch), with one SGD
optimizer whose frozen parameters get no gradient; the head is the last linear layer.

Here the body's part is the round's local work as the federation states it (`local_epochs` or
`local_steps`, 1 epoch by default, the official `local_rep_ep`) and the head's part is
`head_epochs` epochs (9 by default) of the client's samples (ceil(head_epochs * n / batch_size)
steps), both with the clients' local SGD and one stream of seeded batches (the head's steps
draw first). `personal_layers` counts the head from the output
(`fedhet.plugin.parameter_layers`). The server averages the body weighted by the clients' sizes,
as FedAvg does in fedhet (the official code weighs each client's body by its entry of `lens`);
a client that has never trained holds the initial head.
Evaluation is personalized: the global body under each client's own head.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from fedhet.plugin import ClientJob, ClientResult, LocalStats, PartlyLocal, parameter_layers


@contextmanager
def training_only(model: nn.Module, names: frozenset[str]) -> Iterator[None]:
    """Within the block only the parameters named in `names` get gradients (and so move)."""
    for name, param in model.named_parameters():
        param.requires_grad_(name in names)
    try:
        yield
    finally:
        for param in model.parameters():
            param.requires_grad_(True)


class FedRep(PartlyLocal):
    vectorizable = False  # two phases of local SGD, each training a part of the model

    def local_layers(self) -> list[str]:
        return parameter_layers(self.setup.spec.model)[-self.config.personal_layers :]

    def head_steps(self, job: ClientJob) -> int:
        return math.ceil(self.config.head_epochs * job.client.n / self.fed.batch_size)

    def client_update(self, job: ClientJob) -> ClientResult:
        """The engine's local SGD twice, the head's steps then the body's, each training its
        part alone: two phases, which one run of the engine's loop cannot state."""
        head = self.local_names
        body = frozenset(n for n, _ in job.model.named_parameters()) - head
        with training_only(job.model, head):
            first = super().client_update(dataclasses.replace(job, steps=self.head_steps(job)))
        with training_only(job.model, body):
            result = super().client_update(job)
        result.stats = _both(first.stats, result.stats)
        return result


def _both(head: LocalStats, body: LocalStats) -> LocalStats:
    """The round's local training in numbers: the head's steps, then the body's."""
    steps = head.steps + body.steps
    mean = (head.mean_loss * head.steps + body.mean_loss * body.steps) / max(steps, 1)
    return LocalStats(steps, mean, first_loss=head.first_loss)
