"""`fedhet eval`: global, per-class and per-client accuracy of a trained run's model(s)."""

from __future__ import annotations

import numpy as np
import torch
import zarr

from fedhet.core.errors import InputError
from fedhet.core.pipeline import RunContext
from fedhet.core.store import ArtifactStore
from fedhet.engine import tensors
from fedhet.engine.loop import evaluate, read_client_states
from fedhet.metrics.cgv import client_gradient_variance
from fedhet.runs import Run


@torch.no_grad()
def per_class_accuracy(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int
) -> list[float]:
    model.eval()
    logits = [model(x[i : i + 1000])[:, :num_classes] for i in range(0, len(y), 1000)]
    pred = torch.cat(logits).argmax(1)
    return [
        float((pred[y == c] == c).float().mean()) if (y == c).any() else float("nan")
        for c in range(num_classes)
    ]


def evaluate_run(
    run: Run, group: zarr.Group, store: ArtifactStore | None = None, cgv: bool = False
) -> dict:
    """Accuracy of the run's final model; with `cgv`, also its client gradient variance.

    For personalized algorithms (FedBN, SiloBN) the global figures are means over the clients'
    own models, as during training, and each client is scored with its own model.
    """
    from fedhet.engine.train_stage import build_setup, make_algorithm

    if "model" not in group:
        raise InputError(
            f"{run.node.stage} artifacts hold no model to evaluate; eval needs a train stage"
        )
    ctx = RunContext(run.spec, store or ArtifactStore())
    setup = build_setup(run.spec, ctx.upstream(run.node, "partition"))
    clients = list(setup.clients)  # an algorithm may replace them (centralized: their union)
    algorithm = make_algorithm(run.spec, setup)
    model = algorithm.build_model().to(setup.device)
    final = tensors.load(group["model"], "final", setup.device)
    own = read_client_states(group["model"], setup.device) if "clients" in group["model"] else {}
    ds = setup.dataset

    def scores(state: tensors.Tensors, x: torch.Tensor, y: torch.Tensor) -> tuple:
        model.load_state_dict(state)
        return (
            *evaluate(model, x, y, num_classes=ds.num_classes),
            per_class_accuracy(model, x, y, ds.num_classes),
        )

    tested = [
        scores(state, ds.test_x, ds.test_y) for state in algorithm.evaluation_states(final, own)
    ]
    accuracies, losses, per_class = zip(*tested, strict=True)
    report = {
        "algorithm": run.algorithm_label,
        "setting": run.setting_label,
        "seed": run.spec.seed,
        "key": run.node.key,
        "accuracy": float(np.mean(accuracies)),
        "loss": float(np.mean(losses)),
        "per_class": np.nanmean(np.asarray(per_class), axis=0).tolist(),
        "per_client": [
            scores(algorithm.evaluation_states(final, {c.id: own.get(c.id, {})})[0], c.x, c.y)[0]
            for c in clients
        ],
    }
    if cgv:
        model.load_state_dict(final)
        report["cgv"] = client_gradient_variance(model, clients)
    return report
