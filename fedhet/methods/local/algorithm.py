"""`local`: every client trains alone, with no communication at all.

The "SingleNet" baseline of FedTAN (Table 1: "updates all parameters locally without exchanging
any parameter with the server") and the "Local" row of FedBR's Table 1. Neither paper has code
for it (LINs-lab/FedBR has no Local algorithm in fedbr/algorithms*.py), so it is defined here
as the limit of federated training with nothing shared:

- Every client starts from the same initial model (built from the spec's seed on each client:
  nothing is sent) and keeps its own model in its client state across rounds.
- Rounds run as for every method (the same sampling, local steps, learning-rate schedule and
  local SGD, `federation.momentum_buffers` included), so each client trains for the same
  rounds x local steps as it would in a federated run; the server aggregates nothing and its
  model never changes. Nothing crosses the network: bytes up, bytes down and communication
  rounds are 0 in every round.
- Evaluation is personalized (`personalized`, as FedBN and SiloBN): a round scores each client's
  model on its own samples (fedhet.engine.own_evaluation; without `eval.client_test`, a round's
  test accuracy is the mean over the clients that have trained of their own models' accuracy on
  the test set); with `eval.client_test`, `fedhet eval` and `fedhet report` score each
  client's model on the client's own test data (`client_test_mean` is the mean of those
  accuracies), which is the accuracy this baseline is meant to report: a client alone learns its
  own distribution. A client never sampled keeps the initial model. (FedBR's Local row, 10.00%
  on CIFAR-10, is at chance, i.e. local models scored on the balanced global test set.)

Every entry of the model is the client's own (`own_names`): the engine starts each client from
its model and keeps what it trained, on every executor (the vectorized one stacks the cohort's
own models).
"""

from __future__ import annotations

from functools import cached_property

from fedhet.plugin import Tensors, Trainer


class Local(Trainer):
    def shared(self, state: Tensors) -> Tensors:
        return {}  # nothing crosses the network

    @cached_property
    def own_names(self) -> frozenset[str]:
        """The whole model: a client's is its model after its last round (beside any momentum
        buffers in its state), the initial model before its first round."""
        return frozenset(self.build_model().state_dict())

    def aggregate(self, round, global_state, server_state, results, weights) -> Tensors:
        return global_state  # nothing is received: the server's (initial) model never changes

    def global_model(self, global_state: Tensors) -> None:
        return None  # the server's model is the initial one: no client's training reaches it

    def evaluation_states(
        self, global_state: Tensors, client_states: dict[int, Tensors]
    ) -> list[Tensors]:
        """Each client's own model, in client order (the initial model for a client that has
        not trained)."""
        own = [self.own_model(global_state, client_states[c]) for c in sorted(client_states)]
        return own or [global_state]
