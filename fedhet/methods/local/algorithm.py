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

Clients train one at a time (`vectorizable = False`): each starts from its own model, while the
vectorized executor starts a cohort from one shared state.
"""

from __future__ import annotations

from fedhet.plugin import ClientJob, ClientResult, Tensors, Trainer


class Local(Trainer):
    vectorizable = False  # each client starts from its own model

    def shared(self, state: Tensors) -> Tensors:
        return {}  # nothing crosses the network

    def own_model(self, global_state: Tensors, client_state: Tensors) -> Tensors:
        """The client's model: its kept entries (its model after its last round, beside any
        momentum buffers), the initial model before its first round."""
        return {n: client_state.get(n, v) for n, v in global_state.items()}

    def client_update(self, job: ClientJob) -> ClientResult:
        """The engine's loop from the client's own model, which it keeps: the engine starts
        every job from the global state (why this trainer overrides `client_update`)."""
        job.model.load_state_dict(self.own_model(job.global_state, job.client_state))
        result = super().client_update(job)
        job.client_state.update({n: v.clone() for n, v in result.state.items()})
        return result

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
