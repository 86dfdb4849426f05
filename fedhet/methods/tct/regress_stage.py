"""The `regress` stage (TCT stage 2): federated least squares on the normalized eNTK features.

Every client standardizes its features with the global mean and std of the `entk` artifact,
targets are one-hot minus 1/C, and (W, b) is fitted with fedhet.methods.tct.regression.solve.

The artifact has the metrics of a train artifact over TCT's whole run, T1 + T2 rounds, so
that reports compare it round for round, byte for byte and second for second with baselines
run for T1 + T2 rounds. The first T1 rows are stage 1's costs (bytes_up, bytes_down,
comm_rounds, wall_time copied from the bootstrap artifact) with every quality metric NaN:
TCT's predictor exists only from stage 2 on. Each stage-2 row holds
    test_accuracy, train_accuracy   argmax of W^T z + b on the test set / all clients' samples
    test_loss, train_loss           the squared loss 1/(2n) sum ||W^T z + b - y||^2
    divergence                      NaN (the local models stay inside the solver)
    bytes_up, bytes_down            W and b per client and direction (the one-model SCAFFOLD
                                    sends nothing else); round 1 adds the normalization round
    comm_rounds                     1, and 2 in round 1 (the normalization round)
    wall_time                       seconds per round, evaluation included; round 1 also counts
                                    the eNTK extraction and loading the features
    val_accuracy, val_loss          with `data.validation`: as the test ones, on the held-out
                                    samples' features (never fitted)
The fitted model is in linear/weight [p, C] and linear/bias [C], the stage-2 round's model with
the best test accuracy, or validation accuracy with a validation split (the first of equals), in
linear/best/weight and linear/best/bias. With
`runtime.tensorboard` the rows go to the run's TensorBoard folder once stage 2 ends.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import zarr
from torch import Tensor

from fedhet.methods.tct.least_squares import linear_map
from fedhet.methods.tct.regression import centered_one_hot, solve
from fedhet.methods.tct.sections import Stage2Spec
from fedhet.plugin import (
    COST_METRICS,
    DivergedError,
    RunContext,
    StageNode,
    create_array,
    round_note,
    run_metrics,
    stage,
    stage_progress,
    summarize,
    tensorboard,
    write_metrics,
)

BYTES_PER_VALUE = 4  # W and b travel in float32


@dataclass
class Split:
    """Standardized features, centred one-hot targets and labels of some samples."""

    features: Tensor
    targets: Tensor
    labels: Tensor


def standardized(array: zarr.Array, start: int, stop: int, mean: Tensor, std: Tensor) -> Tensor:
    rows = torch.from_numpy(np.asarray(array[start:stop])).to(torch.float32)
    return rows.sub_(mean).div_(std)  # in place: no second [rows, p] buffer


def load_splits(entk: zarr.Group) -> tuple[list[Split], Split]:
    """Each client's split and the test split, read from an entk artifact."""
    offsets = entk["train/offsets"][:].tolist()
    pairs = zip(offsets[:-1], offsets[1:], strict=True)
    clients = [read_split(entk, "train", a, b) for a, b in pairs]
    return clients, read_split(entk, "test", 0, entk["test/labels"].shape[0])


def load_validation(entk: zarr.Group) -> Split | None:
    """The clients' held-out samples' split (`data.validation`), None without a split."""
    if "validation" not in entk:
        return None
    return read_split(entk, "validation", 0, entk["validation/labels"].shape[0])


def read_split(entk: zarr.Group, prefix: str, start: int, stop: int) -> Split:
    """Rows start:stop of `prefix`'s features, standardized with the artifact's statistics."""
    mean = torch.from_numpy(entk["mean"][:]).to(torch.float32)
    std = torch.from_numpy(entk["std"][:]).to(torch.float32)
    labels = torch.from_numpy(entk[f"{prefix}/labels"][start:stop])
    features = standardized(entk[f"{prefix}/features"], start, stop, mean, std)
    return Split(features, centered_one_hot(labels, int(entk.attrs["num_classes"])), labels)


def fit_quality(splits: list[Split], weight: Tensor, bias: Tensor) -> tuple[float, float]:
    """(accuracy, squared loss 1/(2n) sum ||W^T z + b - y||^2) over the union of `splits`."""
    return score_quality([linear_map(s.features, weight) + bias for s in splits], splits)


def score_quality(scores: list[Tensor], splits: list[Split]) -> tuple[float, float]:
    """(accuracy, squared loss 1/(2n) sum ||s - y||^2) of each split's row scores s."""
    correct, squared, count = 0, 0.0, 0
    for score, split in zip(scores, splits, strict=True):
        correct += int((score.argmax(dim=1) == split.labels).sum())
        squared += float((score - split.targets).square().sum())
        count += len(split.labels)
    return correct / count, squared / (2 * count)


def stage1_rows(bootstrap_metrics: zarr.Group, names: tuple[str, ...]) -> dict[str, list[float]]:
    """Stage 1's per-round costs, NaN for every quality metric of `names`."""
    rounds = bootstrap_metrics["wall_time"].shape[0]
    return {
        name: bootstrap_metrics[name][:].tolist()
        if name in COST_METRICS and name in bootstrap_metrics
        else [math.nan] * rounds
        for name in names
    }


@dataclass
class History:
    """Per-round metrics of stage 2, filled by the solver's round callback."""

    clients: list[Split]
    test: Split
    validation: Split | None  # with a validation split, the model is chosen by its accuracy
    names: tuple[str, ...]  # the metrics recorded per round
    bytes_per_round: float
    normalization_bytes: float
    last: float  # when the current round's clock started
    metrics: dict[str, list[float]] = field(init=False)
    best: tuple[Tensor, Tensor] | None = None  # (W, b) of the best selection accuracy so far
    best_accuracy: float = -1.0

    def __post_init__(self) -> None:
        self.metrics = {name: [] for name in self.names}

    def record(
        self, round_number: int, weight: Tensor, bias: Tensor, train_scores: list[Tensor]
    ) -> None:
        train_accuracy, train_loss = score_quality(train_scores, self.clients)
        test_accuracy, test_loss = fit_quality([self.test], weight, bias)
        val_accuracy, val_loss = math.nan, math.nan
        if self.validation is not None:
            val_accuracy, val_loss = fit_quality([self.validation], weight, bias)
        first = round_number == 1
        now = time.perf_counter()
        row = {
            "test_accuracy": test_accuracy,
            "test_loss": test_loss,
            "train_loss": train_loss,
            "train_accuracy": train_accuracy,
            "bytes_up": self.bytes_per_round + (self.normalization_bytes if first else 0.0),
            "bytes_down": self.bytes_per_round + (self.normalization_bytes if first else 0.0),
            "comm_rounds": 2.0 if first else 1.0,
            "wall_time": now - self.last,
            "val_accuracy": val_accuracy,
            "val_loss": val_loss,
        }
        self.last = now
        for name, values in self.metrics.items():
            values.append(row.get(name, math.nan))
        chosen_by = test_accuracy if self.validation is None else val_accuracy
        if chosen_by > self.best_accuracy:
            self.best_accuracy, self.best = chosen_by, (weight.clone(), bias.clone())


def _whole_run(stage1: dict[str, list[float]], history: History) -> dict[str, list[float]]:
    """The run's metrics: stage 1's rounds, then stage 2's."""
    return {name: stage1[name] + history.metrics[name] for name in history.names}


@stage("regress")
def run(node: StageNode, ctx: RunContext, out: zarr.Group, partial: Path) -> None:
    started = time.perf_counter()
    config = Stage2Spec.model_validate(node.config)
    entk = ctx.upstream(node, "entk")
    bootstrap = ctx.upstream(node.upstream["entk"], "bootstrap")
    clients, test = load_splits(entk)
    clients = [c for c in clients if len(c.labels)]  # an empty client never trains (no rows)
    p, classes = clients[0].features.shape[1], clients[0].targets.shape[1]
    history = History(
        clients,
        test,
        load_validation(entk),
        (*run_metrics(ctx.spec), "train_accuracy"),
        bytes_per_round=len(clients) * (p + 1) * classes * BYTES_PER_VALUE,
        normalization_bytes=len(clients) * (entk["mean"].nbytes + entk["std"].nbytes),
        last=started - float(entk.attrs["wall_time_s"]),  # round 1 includes the extraction
    )
    with stage_progress(ctx.console, ctx.spec.runtime.progress, "round") as progress:
        task = progress.add_task(f"{ctx.spec.name}: tct stage 2", total=config.rounds, note="")

        def record(round_number: int, weight: Tensor, bias: Tensor, scores: list[Tensor]) -> None:
            history.record(round_number, weight, bias, scores)
            accuracy = history.metrics["test_accuracy"][-1]
            progress.update(task, completed=round_number, note=round_note(accuracy))

        stage1 = stage1_rows(bootstrap["metrics"], history.names)
        try:
            result = solve(
                [(c.features, c.targets) for c in clients],
                config.algorithm,
                config.rounds,
                config.local_steps,
                config.lr,
                on_round=record,
                solver=config.solver,
            )
        except DivergedError as error:  # a round of the whole run, counted after stage 1's
            rounds = len(stage1["wall_time"]) + error.round_number
            raise DivergedError(str(error), rounds, _whole_run(stage1, history)) from None
    metrics = _whole_run(stage1, history)
    write_metrics(out, metrics)
    create_array(out, "linear/weight", data=result.weight.numpy())
    create_array(out, "linear/bias", data=result.bias.numpy())
    best_weight, best_bias = history.best or (result.weight, result.bias)
    create_array(out, "linear/best/weight", data=best_weight.numpy())
    create_array(out, "linear/best/bias", data=best_bias.numpy())
    events = tensorboard.live_writer(ctx, first_round=0)
    if events is not None:
        rates = ctx.spec.algorithm.learning_rates(ctx.spec)
        with events:
            events.write_rounds(metrics, rates)
    out.attrs.update(
        {
            "stage1_rounds": len(stage1["wall_time"]),
            "summary": summarize(metrics, ctx.spec.eval.target_accuracy),
        }
    )
