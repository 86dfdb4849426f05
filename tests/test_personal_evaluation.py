"""A personalized method's evaluation round scores each client's model on the client's own samples
(fedhet.engine.own_evaluation), by hand:

- `val_accuracy` is the mean over the clients, weighted by their held-out samples, of each
  client's model on its own held-out validation samples, and `test_accuracy` (with
  `eval.client_test`) the mean weighted by training samples of each client's model on its own
  test split, which equals `fedhet eval`'s `client_test_weighted_mean`; a client never sampled is
  scored with the model it holds before training;
- `fedhet tune` selects a personalized method's trial by that validation accuracy;
- an evaluation round scores each own sample once: the samples evaluated do not depend on the
  pooled test set, while a global-model method still scores the pooled sets;
- a global-model method's keys are untouched; a personalized method's train stage has the
  clients' test sets upstream (its stored test curve is scored on them).
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from rich.console import Console

from fedhet.core.spec import Spec, parse_spec
from fedhet.core.store import ArtifactStore
from fedhet.data.client_test import draw_client_tests
from fedhet.data.datasets import load_data
from fedhet.data.partition_stage import spec_partition
from fedhet.engine import loop, tensors
from fedhet.engine.loop import Engine, evaluate
from fedhet.engine.run_format import read_client_states
from fedhet.engine.setup import build_setup
from fedhet.execution.planning import runs_of
from fedhet.execution.train import Options, train
from fedhet.metrics.accuracy import client_spread
from fedhet.reports.evaluation import evaluate_run
from fedhet.tuning.runner import tune
from fedhet.tuning.selection import best_trial

torch.set_num_threads(1)
PER_CLIENT = 40
SPEC = {
    "name": "own-evaluation",
    "seed": 3,
    "data": {"dataset": "digits", "validation": 0.2},
    "partition": {"scheme": "classes", "clients": 5, "classes_per_client": 2},
    "model": {"arch": "mlp", "hidden": [16]},
    "federation": {"rounds": 2, "batch_size": 16, "lr": 0.05, "local_steps": 4},
    "eval": {"client_test": {"per_client": PER_CLIENT}},
    "runtime": {"threads": 1, "progress": False, "device": "cpu", "clients": "sequential"},
}
METHODS = [
    {"name": "ditto", "lam": 0.1},  # a personal model beside the global one
    {"name": "fedper", "personal_layers": 1},  # layers kept on each client
    {"name": "finetune", "finetune_steps": 3},  # the global model fine-tuned at evaluation
    {"name": "local"},  # no global model
]


def spec_of(algorithm: dict, **federation) -> Spec:
    return parse_spec(
        SPEC | {"algorithm": algorithm, "federation": SPEC["federation"] | federation}
    )


def own_samples(spec: Spec) -> tuple[list, list, np.ndarray]:
    """By hand, from the partition and the dataset: each client's held-out samples, its own test
    samples, and its training sizes."""
    part, data = spec_partition(spec), load_data(spec.data, seed=spec.seed)
    held = [(data.train_x[i], data.train_y[i]) for i in part.validation_indices]
    drawn = draw_client_tests(part.histogram, data.test_y.numpy(), PER_CLIENT, spec.seed)
    tests = [(data.test_x[i], data.test_y[i]) for i in drawn]
    return held, tests, part.histogram.sum(axis=1)


def by_hand(trainer, global_state, client_states, spec: Spec) -> tuple[float, float, float]:
    """(validation accuracy weighted by held-out samples, test accuracy weighted by training
    samples, the old pooled validation accuracy: the mean of the clients' models on all held-out
    samples) of each client's model."""
    held, tests, sizes = own_samples(spec)
    model = trainer.build_model()
    val, test, pooled = [], [], []
    all_x, all_y = torch.cat([x for x, _ in held]), torch.cat([y for _, y in held])
    for client in range(len(held)):
        state = trainer.evaluation_states(global_state, {client: client_states.get(client, {})})
        model.load_state_dict(state[0])
        val.append(evaluate(model, *held[client])[0] if len(held[client][1]) else math.nan)
        test.append(evaluate(model, *tests[client])[0] if len(tests[client][1]) else math.nan)
        pooled.append(evaluate(model, all_x, all_y)[0])
    counts = np.array([len(y) for _, y in held], dtype=float)
    measured = counts > 0
    weighted_val = float(np.average(np.asarray(val)[measured], weights=counts[measured]))
    return weighted_val, client_spread(test, sizes).weighted_mean, float(np.mean(pooled))


@pytest.mark.parametrize("algorithm", METHODS, ids=lambda a: a["name"])
def test_each_client_is_scored_on_its_own_validation_and_test_samples(tmp_path, algorithm):
    spec = spec_of(algorithm, clients_per_round=3)  # 2 rounds of 3: a client may never train
    engine = Engine.from_spec(spec, tmp_path / "run")
    state = engine.run()
    val, test, pooled = by_hand(engine.algorithm, state.global_state, state.client_states, spec)
    assert state.metrics["val_accuracy"][-1] == pytest.approx(val, abs=1e-12)
    assert state.metrics["test_accuracy"][-1] == pytest.approx(test, abs=1e-12)
    assert abs(val - pooled) > 0.01  # the pooled figure, scored before, is another one


def test_the_final_rounds_test_accuracy_is_fedhet_evals_weighted_mean(tmp_path):
    spec = spec_of({"name": "fedper", "personal_layers": 1}, rounds=1)
    store = ArtifactStore(tmp_path / "store")
    (run,) = runs_of(spec)
    group = _train(spec, store)
    report = evaluate_run(run, group, store, console=Console(file=io.StringIO()))
    stored = float(group["metrics"]["test_accuracy"][-1])
    assert stored == pytest.approx(report["client_test_weighted_mean"], abs=1e-12)


def _train(spec: Spec, store: ArtifactStore):
    """The spec's one run, trained into `store` through the pipeline (its upstream stages too)."""
    runs = runs_of(spec)
    train(runs, store, Options(), None)
    return store.open("train", runs[0].node.key)


def test_tune_selects_a_personalized_trial_by_its_clients_own_validation_samples(tmp_path):
    spec = parse_spec(
        SPEC
        | {
            "federation": SPEC["federation"] | {"rounds": 1},
            "matrix": {"algorithm": [{"name": "fedper", "personal_layers": 1}], "seed": [0]},
            "tune": {
                "trials": 3,
                "seeds": [5],
                "space": {"federation.lr": {"grid": [0.01, 0.1, 0.5]}},
            },
        }
    )
    store = ArtifactStore(tmp_path / "store")
    quiet = Console(file=io.StringIO())
    (selection,) = tune(spec, spec.tune, store, Options(), lambda runs: None, quiet).selections
    scores = []
    for trial in selection.trials:
        trial_spec = spec_of(
            {"name": "fedper", "personal_layers": 1}, rounds=1, lr=trial.values["federation.lr"]
        ).model_copy(update={"seed": 5})
        (run,) = runs_of(trial_spec)
        assert trial.keys == [run.node.key]
        group = store.open("train", run.node.key)
        setup = build_setup(trial_spec)
        trainer = trial_spec.algorithm.trainer_class()(trial_spec.algorithm, setup)
        final = tensors.load(group["model"], "final")
        val, _, _ = by_hand(trainer, final, read_client_states(group["model"]), trial_spec)
        assert trial.scores == [pytest.approx(val, abs=1e-12)]
        scores.append(val)
    assert selection.values == selection.trials[best_trial(scores)].values
    assert len(set(scores)) == 3


def _counting(monkeypatch) -> list[int]:
    """The samples every `evaluate` of the engine's loop scores, one entry per call."""
    counted: list[int] = []

    def counting(model, x, y, *args, **kwargs):
        counted.append(len(y))
        return evaluate(model, x, y, *args, **kwargs)

    monkeypatch.setattr(loop, "evaluate", counting)
    return counted


@pytest.mark.parametrize("algorithm", METHODS, ids=lambda a: a["name"])
def test_an_evaluation_round_scores_each_own_sample_once(tmp_path, monkeypatch, algorithm):
    engine = Engine.from_spec(spec_of(algorithm), tmp_path / "run")
    state = engine.run()
    setup = engine.setup
    counted = _counting(monkeypatch)
    engine.evaluation_round(state.global_state, state)
    own = sum(c.n for c in setup.held_out) + sum(c.n for c in setup.client_tests)
    assert sum(counted) == own
    pooled = len(setup.dataset.test_y) + setup.validation.n
    assert own < pooled < len(setup.clients) * pooled  # the pooled sets, per client, before
    counted.clear()  # the pooled test set halved: the same samples scored
    half = len(setup.dataset.test_y) // 2
    setup.extras |= {"test_x": setup.dataset.test_x[:half], "test_y": setup.dataset.test_y[:half]}
    engine.evaluation_round(state.global_state, state)
    assert sum(counted) == own


def test_a_global_model_method_still_scores_the_pooled_sets(tmp_path, monkeypatch):
    engine = Engine.from_spec(spec_of({"name": "fedavg"}), tmp_path / "run")
    state = engine.run()
    counted = _counting(monkeypatch)
    engine.evaluation_round(state.global_state, state)
    assert engine.setup.client_tests is None
    assert counted == [len(engine.setup.dataset.test_y), engine.setup.validation.n]


def test_only_a_personalized_runs_train_stage_has_the_clients_test_sets_upstream():
    def upstream(algorithm: dict) -> dict:
        (run,) = runs_of(spec_of(algorithm))
        return {role: node.key for role, node in run.node.upstream.items()}

    fedavg = upstream({"name": "fedavg"})
    assert set(fedavg) == {"partition"}
    ditto = upstream({"name": "ditto"})
    assert set(ditto) == {"partition", "client_test"}
    bigger = SPEC["eval"] | {"client_test": {"per_client": PER_CLIENT + 1}}
    (run,) = runs_of(parse_spec(SPEC | {"algorithm": {"name": "ditto"}, "eval": bigger}))
    assert run.node.upstream["client_test"].key != ditto["client_test"]
