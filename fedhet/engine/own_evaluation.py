"""A personalized method's evaluation round: each client's model on its own samples.

A personalized method (`MethodConfig.personalized`: FedBN, FedPer, Ditto, FedAvg-FT, Local, ...)
has a model per client: the one `Trainer.evaluation_states` gives for that client (a client not
yet sampled holds the model it has before training: counted, not skipped, as `fedhet eval`
counts it). A round scores each client's model on the client's own samples only:
- validation (`data.validation`): the client's held-out samples; a round's `val_accuracy` and
  `val_loss` are the sample-weighted means over the clients (the accuracy and mean loss over
  every held-out sample, each scored by its own client's model), which `fedhet tune` selects on;
- test, with `eval.client_test`: the client's own test split; a round's `test_accuracy` and
  `test_loss` are the means over the clients weighted by their training samples, so the final
  round's `test_accuracy` is `fedhet eval`'s `client_test_weighted_mean` of the final model.
Without `eval.client_test`, a personalized round's test accuracy is the mean over the clients
that have trained of their models on the pooled test set (fedhet.engine.loop), which nothing
else measures. Scoring a client's samples costs one forward pass of its model on them: a round
evaluates each sample once, not once per client as on a pooled set.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from fedhet.data.clients import ClientData
from fedhet.engine.tensors import Tensors
from fedhet.engine.trainer import Trainer
from fedhet.metrics.accuracy import client_spread

Split = list[ClientData]  # each client's samples of one split, in client order
Score = tuple[float, float]  # (accuracy, mean cross-entropy)
NOT_SCORED: Score = (math.nan, math.nan)


def own_scores(
    trainer: Trainer,
    model: nn.Module,
    global_state: Tensors,
    client_states: dict[int, Tensors],
    splits: list[Split],
    score: Callable[[nn.Module, torch.Tensor, torch.Tensor], Score],
) -> list[list[Score]]:
    """Per split, each client's (accuracy, loss) of its own model on its samples of the split
    (NaN for a client without any); a client's model is built once for every split.
    `score(model, x, y)` scores one model."""
    scores: list[list[Score]] = [[] for _ in splits]
    for client in range(len(splits[0])):
        samples = [split[client] for split in splits]
        if not any(data.n for data in samples):
            for row in scores:
                row.append(NOT_SCORED)
            continue
        own = {client: client_states.get(client, {})}
        model.load_state_dict(trainer.evaluation_states(global_state, own)[0])
        for row, data in zip(scores, samples, strict=True):
            row.append(score(model, data.x, data.y) if data.n else NOT_SCORED)
    return scores


def weighted_score(scores: list[Score], weights: list[float]) -> Score:
    """The (accuracy, loss) of `scores` averaged over the clients with `weights` (clients not
    scored left out; NaN when none is)."""
    accuracies, losses = np.asarray(scores, dtype=np.float64).T
    return (
        client_spread(accuracies, weights).weighted_mean,
        client_spread(losses, weights).weighted_mean,
    )
