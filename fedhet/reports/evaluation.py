"""`fedhet eval`: global, per-class and per-client accuracy of a run's final or best model."""

from __future__ import annotations

from dataclasses import asdict, fields, replace

import numpy as np
import torch
import zarr
from rich.console import Console

from fedhet.core import provenance
from fedhet.core.errors import InputError
from fedhet.core.pipeline import RunContext, ensure
from fedhet.core.store import ArtifactStore
from fedhet.data.client_test import client_test_data
from fedhet.data.client_test_plan import client_test_node
from fedhet.data.clients import ClientData
from fedhet.data.datasets import load_data
from fedhet.data.partition_format import load_partition
from fedhet.engine import tensors
from fedhet.engine.description import ModelChoice
from fedhet.engine.loop import evaluate
from fedhet.engine.run_format import read_client_states
from fedhet.engine.setup import build_setup, own_angle_test
from fedhet.execution.planning import Run
from fedhet.execution.results import Outcome
from fedhet.metrics.accuracy import ClientSpread, Scores, class_accuracies, client_spread
from fedhet.metrics.cgv import client_gradient_variance
from fedhet.process import allocator


@torch.no_grad()
def per_class_accuracy(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int, scored: int
) -> list[float]:
    """Accuracy on each of the `num_classes` classes, predicting over the first `scored`
    outputs."""
    model.eval()
    logits = [model(x[i : i + 1000])[:, :scored] for i in range(0, len(y), 1000)]
    return class_accuracies(torch.cat(logits).argmax(1), y, num_classes)


def evaluate_run(
    run: Run,
    group: zarr.Group,
    store: ArtifactStore | None = None,
    cgv: bool = False,
    model: ModelChoice = "final",
    console: Console | None = None,
) -> dict:
    """Scores of the run's `model` (final or best); with `cgv`, also the client gradient
    variance of its final network (None for a method whose model is no network, like TCT's).
    With `eval.client_test`, each client's accuracy on its own test set and their spread
    (`client_test_mean`, `client_test_weighted_mean` weighted by the clients' training samples,
    `client_test_worst_decile`, `client_test_std`; see fedhet.metrics.accuracy.ClientSpread).

    A method whose final artifact holds no network scores it itself (MethodConfig.score_artifact);
    the same fields come back for every method.
    """
    provenance.use_threads(run.spec.runtime.threads)
    allocator.keep_freed_memory()
    ctx = RunContext(run.spec, store or ArtifactStore(), console or Console(stderr=True))
    model = stored_model(run, model, ctx.console)
    scores = run.spec.algorithm.score_artifact(ctx, run.node, group, model)
    variance = None
    if scores is None:
        scores, variance = network_scores(run, ctx, group, model, cgv)
    if not run.spec.algorithm.personalized:  # the model it evaluates is its global model
        scores = replace(scores, global_accuracy=scores.accuracy)
    report = {**_described(run, model), **asdict(scores)}
    if scores.client_test is not None:
        sizes = load_partition(ctx.upstream(run.node, "partition")).histogram.sum(axis=1)
        spread = client_spread(scores.client_test, sizes)
        report.update({f"client_test_{name}": value for name, value in asdict(spread).items()})
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
    run: Run,
    reached: Outcome,
    store: ArtifactStore,
    cgv: bool,
    model: ModelChoice,
    console: Console | None = None,
) -> dict:
    """`evaluate_run`'s report with `diverged`: None, or for a run that diverged the round it
    diverged in, and no scores (it has no model to score)."""
    if reached.diverged is None:
        report = evaluate_run(run, reached.group, store, cgv=cgv, model=model, console=console)
        return {**report, "diverged": None}
    unscored = {field.name: None for field in fields(Scores)}
    if run.spec.eval.client_test is not None:
        unscored |= {f"client_test_{field.name}": None for field in fields(ClientSpread)}
    return {
        **_described(run, model),
        "diverged": reached.diverged_round,
        **unscored,
        **({"cgv": None} if cgv else {}),
    }


def stored_model(run: Run, model: ModelChoice, console: Console) -> ModelChoice:
    """`model`, except for `best` of a personalized run (FedBN, SiloBN): `final`, said in one line.

    Such a run stores its clients' own entries for the final round only; its stored best is the
    server's state at the best round, whose clients' entries are gone, and pairing it with the
    final round's would score a model no client ever held.
    """
    if model == "best" and run.spec.algorithm.personalized:
        console.print(
            f"{run.label}: best not stored for personalized runs (clients' own models are kept "
            "for the final round only); using final",
            markup=False,
            soft_wrap=True,
        )
        return "final"
    return model


def network_scores(
    run: Run, ctx: RunContext, group: zarr.Group, which: ModelChoice, cgv: bool
) -> tuple[Scores, dict[str, float] | None]:
    """Scores of a train artifact's network, and with `cgv` the client gradient variance of its
    final model.

    For personalized algorithms (FedBN, SiloBN, FedPer, Ditto, ...) the global figures are means
    over the clients' own models, as during training, each client is scored with its own model
    (the one it holds before training for a client never sampled: counted, not skipped), and
    `global_accuracy` scores the method's global model, where it has one, on the test set; every
    other method scores each client with the global model. A client without samples scores NaN.
    """
    if "model" not in group:
        raise InputError(
            f"{run.node.stage} artifacts hold no model to evaluate; eval needs a train stage"
        )
    setup = build_setup(run.spec, ctx.upstream(run.node, "partition"))
    clients = list(setup.clients)  # a trainer may replace them (centralized: their union)
    trainer = run.spec.algorithm.trainer_class()(run.spec.algorithm, setup)
    model = trainer.build_model().to(setup.device)
    chosen = tensors.load(group["model"], which, setup.device)
    own = read_client_states(group["model"], setup.device) if "clients" in group["model"] else {}
    ds = setup.dataset
    scored = run.spec.algorithm.scored_outputs(ds.num_classes)

    def scores(state: tensors.Tensors, x: torch.Tensor, y: torch.Tensor) -> tuple:
        model.load_state_dict(state)
        return (
            *evaluate(model, x, y, num_classes=scored),
            per_class_accuracy(model, x, y, ds.num_classes, scored),
        )

    def client_accuracy(client: int, data: ClientData) -> float:
        """Accuracy on `data` of the model client `client` uses."""
        if not data.n:
            return float("nan")
        state = trainer.evaluation_states(chosen, {client: own.get(client, {})})[0]
        model.load_state_dict(state)
        return evaluate(model, data.x, data.y, num_classes=scored)[0]

    tested = [
        scores(state, ds.test_x, ds.test_y) for state in trainer.evaluation_states(chosen, own)
    ]
    accuracies, losses, per_class = zip(*tested, strict=True)
    federation_model = trainer.global_model(chosen)
    global_accuracy = None
    if run.spec.algorithm.personalized and federation_model is not None:
        global_accuracy = scores(federation_model, ds.test_x, ds.test_y)[0]
    tests = client_tests(run, ctx, setup.device)
    part = load_partition(ctx.upstream(run.node, "partition"))
    own_angle = None
    if part.angles is not None:
        unrotated = load_data(run.spec.data, seed=run.spec.seed)
        x = own_angle_test(unrotated, part, run.spec.partition.interpolation)
        x = x.to(setup.device)
        states = trainer.evaluation_states(chosen, own)
        own_angle = float(np.mean([scores(state, x, ds.test_y)[0] for state in states]))
    result = Scores(
        accuracy=float(np.mean(accuracies)),
        loss=float(np.mean(losses)),
        per_class=np.nanmean(np.asarray(per_class), axis=0).tolist(),
        per_client=[client_accuracy(c.id, c) for c in clients],
        client_test=None if tests is None else [client_accuracy(t.id, t) for t in tests],
        own_angle=own_angle,
        global_accuracy=global_accuracy,
    )
    if not cgv:
        return result, None
    model.load_state_dict(tensors.load(group["model"], "final", setup.device))
    return result, client_gradient_variance(model, clients)


def client_tests(run: Run, ctx: RunContext, device: torch.device) -> list[ClientData] | None:
    """Each client's own test set (computed and stored on first use), or None without
    `eval.client_test`."""
    node = client_test_node(run.spec)
    if node is None:
        return None
    return client_test_data(run.spec, ctx.upstream(node, "partition"), ensure(node, ctx), device)
