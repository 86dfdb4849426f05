"""`local` (FedTAN's SingleNet, FedBR's Local): every client trains alone, nothing is sent.

- No parameter crosses between clients: changing one client's data leaves every other client's
  final model unchanged bit for bit (and each model is the replay of that client's own SGD on its
  own data, from the initial model, over the rounds it was sampled).
- Traffic is zero in every round, and the server's model never moves.
- The per-client test metric (`eval.client_test`) is the mean of each client's accuracy, with its
  own model, on its own test data, recomputed here from the replayed models.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedhet.core.errors import InputError
from fedhet.core.rng import torch_generator
from fedhet.core.spec import Spec, parse_spec
from fedhet.core.store import ArtifactStore
from fedhet.data.client_test import draw_client_tests
from fedhet.data.clients import ClientData
from fedhet.data.datasets import load_dataset
from fedhet.data.partition import make_partition
from fedhet.engine.local import batch_schedule
from fedhet.engine.loop import Engine, sample_holders
from fedhet.engine.schedule import round_lr
from fedhet.execution.planning import runs_of
from fedhet.execution.results import execute
from fedhet.reports.evaluation import evaluate_run

torch.set_num_threads(1)
FEDHET = Path(sys.executable).parent / "fedhet"
PER_CLIENT = 40
SPEC = {
    "name": "local-digits",
    "seed": 5,
    "data": {"dataset": "digits"},
    "partition": {"scheme": "classes", "clients": 5, "classes_per_client": 2},
    "model": {"arch": "mlp", "hidden": [16]},
    "federation": {
        "rounds": 4,
        "clients_per_round": 3,
        "batch_size": 16,
        "lr": 0.1,
        "lr_decay": 0.9,
        "local_steps": 4,
        "momentum": 0.5,
    },
    "algorithm": {"name": "local"},
    "eval": {"client_test": {"per_client": PER_CLIENT}},
    # the replay is of the sequential executor's steps, bit for bit (auto would train these
    # clients vectorized, rounding differently: tests/test_client_start.py compares the two)
    "runtime": {"threads": 1, "progress": False, "device": "cpu", "clients": "sequential"},
}


def local_spec(**federation) -> Spec:
    return parse_spec(SPEC | {"federation": SPEC["federation"] | federation})


def own_models(state) -> dict[int, dict]:
    return {c: {n: s[n] for n in state.global_state} for c, s in state.client_states.items()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The run, and the same run with client 1's data replaced by noise."""
    folder = tmp_path_factory.mktemp("local")
    engine = Engine.from_spec(local_spec(), folder / "a")
    initial = {n: v.clone() for n, v in engine.initial_state().global_state.items()}
    state = engine.run()
    changed = Engine.from_spec(local_spec(), folder / "b")
    client = changed.setup.clients[1]
    gen = torch.Generator().manual_seed(0)
    noise = ClientData(1, torch.randn(client.x.shape, generator=gen), client.y.flip(0))
    changed.setup.clients[1] = noise
    return engine, initial, state, changed.run()


def test_no_parameter_crosses_between_clients(trained):
    engine, _, state, changed = trained
    assert set(state.client_states) == set(changed.client_states) == {0, 1, 2, 3, 4}
    mine, theirs = own_models(state), own_models(changed)
    for cid in (0, 2, 3, 4):
        for name, value in mine[cid].items():
            assert torch.equal(theirs[cid][name], value), (cid, name)
    assert any(not torch.equal(theirs[1][n], v) for n, v in mine[1].items())  # it did change


def test_each_model_is_its_clients_sgd_alone(trained):
    """The replay: the initial model, and each round the client is sampled, its local SGD
    (momentum reset each round) on its own batches."""
    engine, initial, state, _ = trained
    fed, seed = engine.spec.federation, engine.spec.seed
    for cid, own in own_models(state).items():
        model = engine.algorithm.build_model()
        model.load_state_dict(initial)
        client = engine.setup.clients[cid]
        for rnd in range(fed.rounds):
            if cid not in sample_holders(seed, rnd, engine.holders, fed.clients_per_round):
                continue
            optimizer = torch.optim.SGD(
                model.parameters(), lr=round_lr(fed, rnd), momentum=fed.momentum
            )
            generator = torch_generator(seed, "local", rnd, cid)
            for idx in batch_schedule(client.n, fed.batch_size, fed.local_steps, generator):
                optimizer.zero_grad()
                F.cross_entropy(model(client.x[idx]), client.y[idx]).backward()
                optimizer.step()
        for name, value in model.state_dict().items():
            assert torch.equal(own[name], value), (cid, name)


def test_traffic_is_zero_and_the_server_model_never_moves(trained):
    _, initial, state, _ = trained
    for metric in ("bytes_up", "bytes_down", "comm_rounds"):
        assert state.metrics[metric] == [0.0] * 4, metric
    for name, value in initial.items():
        assert torch.equal(state.global_state[name], value)
    assert all(
        not torch.equal(m["head.weight"], initial["head.weight"])
        for m in own_models(state).values()
    )


def test_the_per_client_test_metric_is_each_clients_own_accuracy_on_its_own_test_data(tmp_path):
    spec = local_spec()
    (run,) = runs_of(spec)
    store = ArtifactStore(tmp_path / "store")
    report = evaluate_run(run, execute(run, store), store)
    # recomputed here: each client's model (the engine's, whose models the replay above checks)
    # on its own test samples, drawn in its training label proportions
    state = Engine.from_spec(spec, tmp_path / "engine").run()
    digits = load_dataset("digits")
    part = make_partition(spec.partition, digits.train_y.numpy(), 10, spec.seed)
    tests = draw_client_tests(part.histogram, digits.test_y.numpy(), PER_CLIENT, spec.seed)
    model = Engine.from_spec(spec, tmp_path / "m").algorithm.build_model()
    expected = []
    for cid, idx in enumerate(tests):
        model.load_state_dict(own_models(state)[cid])
        with torch.no_grad():
            predicted = model(digits.test_x[idx]).argmax(1)
        expected.append(float((predicted == digits.test_y[idx]).double().mean()))
    assert report["client_test"] == pytest.approx(expected, abs=1e-12)
    assert report["client_test_mean"] == pytest.approx(np.mean(expected), abs=1e-12)
    # each client alone learns its own two classes: far above its models' global-test mean
    assert report["client_test_mean"] > report["accuracy"] + 0.2
    # a round's test accuracy: each client's model on its own test data, weighted mean
    final = state.metrics["test_accuracy"][-1]
    assert report["client_test_weighted_mean"] == pytest.approx(final, abs=1e-12)


def test_config_refuses_other_methods_fields():
    with pytest.raises(InputError, match="algorithm.mu: applies to algorithm"):
        parse_spec(SPEC | {"algorithm": {"name": "local", "mu": 0.1}})
    config = parse_spec(SPEC).algorithm
    assert config.label() == "Local" and config.personalized


def test_spec_validate_through_the_installed_cli(tmp_path):
    import yaml

    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(SPEC))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(SPEC | {"algorithm": {"name": "locall"}}))
    ok = subprocess.run([FEDHET, "spec", "validate", good], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    refused = subprocess.run([FEDHET, "spec", "validate", bad], capture_output=True, text=True)
    assert refused.returncode == 2
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    assert "local" in refused.stderr
