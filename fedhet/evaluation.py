"""`fedhet eval`: global, per-class and per-client accuracy of a trained global model."""

from __future__ import annotations

import torch
import zarr

from fedhet.errors import InputError
from fedhet.fl import tensors
from fedhet.fl.engine import evaluate
from fedhet.metrics.cgv import client_gradient_variance
from fedhet.pipeline import RunContext
from fedhet.runs import Run
from fedhet.store import ArtifactStore


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
    """Accuracy of the run's final model; with `cgv`, also its client gradient variance."""
    from fedhet.stages.train import build_setup, make_algorithm

    if "model" not in group:
        raise InputError(
            f"{run.node.stage} artifacts hold no model to evaluate; eval needs a train stage"
        )
    ctx = RunContext(run.spec, store or ArtifactStore())
    setup = build_setup(run.spec, ctx.upstream(run.node, "partition"))
    clients = list(setup.clients)  # an algorithm may replace them (centralized: their union)
    model = make_algorithm(run.spec, setup).build_model().to(setup.device)
    model.load_state_dict(tensors.load(group["model"], "final", setup.device))
    ds = setup.dataset
    accuracy, loss = evaluate(model, ds.test_x, ds.test_y, num_classes=ds.num_classes)
    report = {
        "algorithm": run.algorithm_label,
        "setting": run.setting_label,
        "seed": run.spec.seed,
        "key": run.node.key,
        "accuracy": accuracy,
        "loss": loss,
        "per_class": per_class_accuracy(model, ds.test_x, ds.test_y, ds.num_classes),
        "per_client": [evaluate(model, c.x, c.y, num_classes=ds.num_classes)[0] for c in clients],
    }
    if cgv:
        report["cgv"] = client_gradient_variance(model, clients)
    return report
