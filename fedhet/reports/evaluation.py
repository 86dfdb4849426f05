"""`fedhet eval`: global, per-class and per-client accuracy of a run's final or best model."""

from __future__ import annotations

from dataclasses import asdict, fields

import numpy as np
import torch
import zarr

from fedhet.core import provenance
from fedhet.core.errors import InputError
from fedhet.core.pipeline import RunContext
from fedhet.core.store import ArtifactStore
from fedhet.engine import tensors
from fedhet.engine.description import ModelChoice
from fedhet.engine.loop import evaluate
from fedhet.engine.run_format import read_client_states
from fedhet.engine.setup import build_setup
from fedhet.execution.planning import Run
from fedhet.execution.results import Outcome
from fedhet.metrics.accuracy import Scores, class_accuracies
from fedhet.metrics.cgv import client_gradient_variance
from fedhet.process import allocator


@torch.no_grad()
def per_class_accuracy(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int
) -> list[float]:
    model.eval()
    logits = [model(x[i : i + 1000])[:, :num_classes] for i in range(0, len(y), 1000)]
    return class_accuracies(torch.cat(logits).argmax(1), y, num_classes)


def evaluate_run(
    run: Run,
    group: zarr.Group,
    store: ArtifactStore | None = None,
    cgv: bool = False,
    model: ModelChoice = "final",
) -> dict:
    """Scores of the run's `model` (final or best); with `cgv`, also the client gradient
    variance of its final network (None for a method whose model is no network, like TCT's).

    A method whose final artifact holds no network scores it itself (MethodConfig.score_artifact);
    the same fields come back for every method.
    """
    provenance.use_threads(run.spec.runtime.threads)
    allocator.keep_freed_memory()
    ctx = RunContext(run.spec, store or ArtifactStore())
    scores = run.spec.algorithm.score_artifact(ctx, run.node, group, model)
    variance = None
    if scores is None:
        scores, variance = network_scores(run, ctx, group, model, cgv)
    report = {**_described(run, model), **asdict(scores)}
    if cgv:
        report["cgv"] = variance
    return report


def _described(run: Run, model: ModelChoice) -> dict:
    return {
        "algorithm": run.algorithm_label,
        "setting": run.setting_label,
        "seed": run.spec.seed,
        "key": run.node.key,
        "model": model,
    }


def evaluate_outcome(
    run: Run, reached: Outcome, store: ArtifactStore, cgv: bool, model: ModelChoice
) -> dict:
    """`evaluate_run`'s report with `diverged`: None, or for a run that diverged the round it
    diverged in, and no scores (it has no model to score)."""
    if reached.diverged is None:
        report = evaluate_run(run, reached.group, store, cgv=cgv, model=model)
        return {**report, "diverged": None}
    unscored = {field.name: None for field in fields(Scores)}
    return {
        **_described(run, model),
        "diverged": reached.diverged_round,
        **unscored,
        **({"cgv": None} if cgv else {}),
    }


def network_scores(
    run: Run, ctx: RunContext, group: zarr.Group, which: ModelChoice, cgv: bool
) -> tuple[Scores, dict[str, float] | None]:
    """Scores of a train artifact's network, and with `cgv` the client gradient variance of its
    final model.

    For personalized algorithms (FedBN, SiloBN) the global figures are means over the clients'
    own models, as during training, and each client is scored with its own model (NaN for a
    client without samples).
    """
    if "model" not in group:
        raise InputError(
            f"{run.node.stage} artifacts hold no model to evaluate; eval needs a train stage"
        )
    setup = build_setup(run.spec, ctx.upstream(run.node, "partition"))
    clients = list(setup.clients)  # a trainer may replace them (centralized: their union)
    trainer = run.spec.algorithm.trainer_class()(run.spec.algorithm, setup)
    if which == "best" and run.spec.algorithm.personalized:
        raise InputError(
            f"--model best: {run.algorithm_label} keeps each client's own model entries, stored "
            "for the final round only; use --model final"
        )
    model = trainer.build_model().to(setup.device)
    chosen = tensors.load(group["model"], which, setup.device)
    own = read_client_states(group["model"], setup.device) if "clients" in group["model"] else {}
    ds = setup.dataset

    def scores(state: tensors.Tensors, x: torch.Tensor, y: torch.Tensor) -> tuple:
        model.load_state_dict(state)
        return (
            *evaluate(model, x, y, num_classes=ds.num_classes),
            per_class_accuracy(model, x, y, ds.num_classes),
        )

    tested = [
        scores(state, ds.test_x, ds.test_y) for state in trainer.evaluation_states(chosen, own)
    ]
    accuracies, losses, per_class = zip(*tested, strict=True)
    result = Scores(
        accuracy=float(np.mean(accuracies)),
        loss=float(np.mean(losses)),
        per_class=np.nanmean(np.asarray(per_class), axis=0).tolist(),
        per_client=[
            scores(trainer.evaluation_states(chosen, {c.id: own.get(c.id, {})})[0], c.x, c.y)[0]
            if c.n
            else float("nan")
            for c in clients
        ],
    )
    if not cgv:
        return result, None
    model.load_state_dict(tensors.load(group["model"], "final", setup.device))
    return result, client_gradient_variance(model, clients)
