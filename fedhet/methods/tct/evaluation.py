"""`fedhet eval` of a TCT run: its stage-2 linear model scored on the standardized eNTK features.

The same figures as for a network: accuracy and (squared) loss on the test features, per-class
test accuracy, and the accuracy on each client's own training features (NaN for an empty
client), computed exactly as the regress stage computed its per-round metrics.
"""

from __future__ import annotations

import math

import torch
import zarr
from torch import Tensor

from fedhet.methods.tct.regress_stage import fit_quality, load_splits
from fedhet.methods.tct.regression import predict
from fedhet.plugin import InputError, ModelChoice, Scores, class_accuracies


def linear_model(regress: zarr.Group, model: ModelChoice) -> tuple[Tensor, Tensor]:
    """(W, b) of the final or the best stage-2 model."""
    stored = regress["linear"]
    if model == "best":
        if "best" not in stored:
            raise InputError(
                "--model best: the regress artifact was computed before best models were "
                "stored; use --model final"
            )
        stored = stored["best"]
    return torch.from_numpy(stored["weight"][:]), torch.from_numpy(stored["bias"][:])


def linear_scores(regress: zarr.Group, entk: zarr.Group, model: ModelChoice) -> Scores:
    clients, test = load_splits(entk)
    weight, bias = linear_model(regress, model)
    accuracy, loss = fit_quality([test], weight, bias)
    classes = int(entk.attrs["num_classes"])
    return Scores(
        accuracy=accuracy,
        loss=loss,
        per_class=class_accuracies(predict(test.features, weight, bias), test.labels, classes),
        per_client=[
            fit_quality([client], weight, bias)[0] if len(client.labels) else math.nan
            for client in clients
        ],
    )
