"""`fedbabu`: Towards Enhanced Representation for Federated Image Classification (Oh et al.,
2022).

During federated training only the body is trained and averaged ("body aggregation, body
update"): the head keeps its random initialization on every client. For evaluation each client
fine-tunes the global model on its own training data; the paper fine-tunes the whole model for
tau_f epochs and also reports fine-tuning the head alone. The official code (jhoon-oh/FedBABU)
was not in the index read for this; PFLlib (TsingZ0/PFLlib, clientbabu.py) does the same with
the head's parameters excluded from training (`requires_grad = False`) and, after the last
round, `fine_tuning_epochs` epochs of body and head (the default) or either.

Here:
- The head is the model's seeded initial head (`head.*`): the same on every client without
  being sent, so it does not cross the network and bytes count the body alone. It is restored
  after every local step, exactly (a learning rate of 0 for it, whatever the momentum or weight
  decay), and the server keeps its copy rather than averaging identical ones, so it never changes
  by a bit.
- Fine-tuning is `finetune_steps` steps (not epochs: a step count is the same work for every
  client) of the clients' local SGD at `finetune_lr` (default `federation.lr`), of the whole
  model (`finetune: full`, the paper's) or the head (`finetune: head`), on batches drawn from the
  client's own generator (fedhet.plugin.fine_tune), always from the global model (nothing a
  client fine-tunes is kept). It happens at every evaluation: during training (each client's
  fine-tuned model scored on its own samples: fedhet.engine.own_evaluation) and in `fedhet
  eval`, where every client with samples is fine-tuned, those never sampled included. With 0
  steps each client's model is the global one.
"""

from __future__ import annotations

from functools import cached_property

from fedhet.plugin import ClientStep, FineTuned, PartlyShared, Stacked, Tensors


class FrozenHead(ClientStep):
    """The head's parameters put back to the round's values after every optimizer step."""

    def __init__(self, head: Tensors):
        self.head = head

    def after_step(self, params: Stacked, extras: Stacked, lr: float) -> None:
        for name, value in self.head.items():
            params[name].copy_(value)  # broadcast over the cohort's leading client dim


class FedBABU(PartlyShared, FineTuned):
    @cached_property
    def head_names(self) -> frozenset[str]:
        return frozenset(n for n in self.param_names if n.startswith("head."))

    @property
    def unshared_names(self) -> frozenset[str]:
        return self.head_names  # every client's is the seeded initial head

    def client_step(self, round: int, global_state: Tensors, server_state: Tensors) -> FrozenHead:
        return FrozenHead({n: global_state[n] for n in self.head_names})

    def fine_tuned_names(self) -> frozenset[str] | None:
        return self.head_names if self.config.finetune == "head" else None
