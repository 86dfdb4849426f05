"""GroupDRO as FedBR's federated baseline: q's exponentiated-gradient update on hand-built group
losses, the clients as the groups (q_c from each client's loss at the round's global model,
kept across rounds, weighing the aggregate), eta = 0 as FedAvg bit for bit, the vectorized
executor's agreement, config validation, and a short digits run through the installed CLI."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import spec_data

from fedhet.core.errors import InputError
from fedhet.core.rng import torch_generator
from fedhet.core.spec import parse_spec
from fedhet.engine.client_executors import VectorizedExecutor
from fedhet.engine.loop import Engine
from fedhet.engine.tensors import weighted_average
from fedhet.methods.groupdro.algorithm import (
    LOG_Q,
    GroupDRO,
    MixedGroupDRO,
    exponentiated_gradient,
    reweighted,
)

torch.set_num_threads(1)
FEDHET = Path(sys.executable).with_name("fedhet")  # the installed console script

BASE = {
    "seed": 7,
    "data": {"dataset": "digits"},
    "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.3},
    "model": {"arch": "mlp", "hidden": [16]},
    "federation": {
        "rounds": 3,
        "batch_size": 16,
        "lr": 0.05,
        "local_steps": 3,
        "momentum": 0.9,
        "weight_decay": 1e-3,
    },
    "algorithm": {"name": "groupdro"},
    # bitwise comparisons against the sequential executor
    "runtime": {"threads": 1, "progress": False, "device": "cpu", "clients": "sequential"},
}


def make_spec(algorithm: dict, **sections) -> dict:
    return spec_data(BASE, algorithm, **sections)


# --- q's update ----------------------------------------------------------------------------


def test_q_update_is_the_exponentiated_gradient_formula_on_hand_built_losses():
    q = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    losses = torch.tensor([2.0, 0.5, 1.0, 3.0], dtype=torch.float64)
    eta = 0.25
    by_hand = [q[g] * math.exp(eta * losses[g]) for g in range(4)]
    expected = torch.tensor([v / sum(by_hand) for v in by_hand], dtype=torch.float64)
    torch.testing.assert_close(exponentiated_gradient(q, losses, eta), expected, rtol=1e-15, atol=0)
    # the worst group gains weight, the best loses it; eta = 0 keeps q
    new = exponentiated_gradient(q, losses, eta)
    assert new[3] > q[3] and new[1] < q[1]
    assert torch.equal(exponentiated_gradient(q, losses, 0.0), q / q.sum())


def test_aggregation_weights_are_fedavgs_times_q_from_log_q():
    weights, log_q = [0.5, 0.3, 0.2], [0.0, 0.7, -0.4]
    q = [math.exp(v) for v in log_q]
    expected = [
        w * v / sum(a * b for a, b in zip(weights, q, strict=True))
        for w, v in zip(weights, q, strict=True)
    ]
    assert reweighted(weights, log_q) == pytest.approx(expected, rel=1e-14)
    assert reweighted(weights, [3.0, 3.0, 3.0]) == weights  # uniform q: FedAvg's, unchanged
    # log q far past exp's range: still the normalized weights (the official p is never reset)
    assert reweighted([0.5, 0.5], [2000.0, 2000.0 + math.log(3)]) == pytest.approx([0.25, 0.75])


def test_q_follows_each_clients_loss_at_the_global_model_and_weighs_the_aggregate(tmp_path):
    """Three rounds, every client each round: q_c after round t is the exponentiated-gradient
    update with l_c = the round's global model's loss on client c's first local batch, and the
    new global model is the clients' models averaged with weights n_c q_c / sum."""
    eta = 0.5
    spec = parse_spec(make_spec({"name": "groupdro", "eta": eta}))
    engine = Engine.from_spec(spec, tmp_path)
    assert isinstance(engine.algorithm, GroupDRO)
    seen: list[tuple] = []
    aggregate = engine.algorithm.aggregate

    def spy(rnd, global_state, server_state, results, weights):
        seen.append((rnd, copy.deepcopy(global_state), results, list(weights)))
        return aggregate(rnd, global_state, server_state, results, weights)

    engine.algorithm.aggregate = spy
    state = engine.run()
    sizes = torch.tensor(engine.setup.sizes, dtype=torch.float64)
    q = torch.full((4,), 0.25, dtype=torch.float64)
    model = engine.algorithm.build_model()
    for rnd, global_state, results, weights in seen:
        assert [r.client for r in results] == [0, 1, 2, 3]
        model.load_state_dict(global_state)
        losses = []
        for r in results:  # the first batch of the client's seeded schedule, at the global model
            gen = torch_generator(spec.seed, "local", rnd, r.client)
            first = torch.randperm(r.num_samples, generator=gen)[: spec.federation.batch_size]
            client = engine.setup.clients[r.client]
            with torch.no_grad():
                loss = float(F.cross_entropy(model(client.x[first]), client.y[first]))
            assert r.stats.first_loss == pytest.approx(loss, rel=1e-6)
            losses.append(loss)
        q = exponentiated_gradient(q, torch.tensor(losses, dtype=torch.float64), eta)
        log_q = torch.stack([r.upload[LOG_Q] for r in results])
        torch.testing.assert_close(torch.softmax(log_q, 0), q, rtol=1e-12, atol=0)
        mixed = sizes * q / (sizes * q).sum()
        used = reweighted(weights, log_q.tolist())
        assert used == pytest.approx(mixed.tolist(), rel=1e-12)
        assert used != pytest.approx(weights, rel=1e-6)  # q did move them
        after = seen[rnd + 1][1] if rnd + 1 < len(seen) else state.global_state
        expected = weighted_average([r.state for r in results], used)
        assert all(torch.equal(after[k], expected[k]) for k in expected)
    # q_c stays with the client across rounds (its state), as the official local model's p
    kept = torch.stack([state.client_states[c][LOG_Q] for c in range(4)])
    torch.testing.assert_close(torch.softmax(kept, 0), q, rtol=1e-12, atol=0)


def test_eta_zero_is_fedavg_bit_for_bit_and_eta_changes_it(tmp_path):
    sampled = {"clients_per_round": 3}  # partial participation, renormalized weights
    runs = {
        name: Engine.from_spec(parse_spec(make_spec(algo, federation=sampled)), tmp_path / name)
        .run()
        .global_state
        for name, algo in {
            "fedavg": {"name": "fedavg"},
            "uniform": {"name": "groupdro", "eta": 0.0},
            "dro": {"name": "groupdro", "eta": 1.0},
        }.items()
    }
    fedavg = runs["fedavg"]
    assert runs["uniform"].keys() == fedavg.keys()
    assert all(torch.equal(runs["uniform"][k], v) for k, v in fedavg.items())
    assert not all(torch.equal(runs["dro"][k], v) for k, v in fedavg.items())


def test_mixup_option_mixes_as_the_official_groupdro_and_vanishes_as_alpha_goes_to_0(tmp_path):
    def run(name: str, **options) -> tuple[type, dict]:
        spec = parse_spec(make_spec({"name": "groupdro", "eta": 0.5, **options}))
        engine = Engine.from_spec(spec, tmp_path / name)
        return type(engine.algorithm), engine.run().global_state

    plain_class, plain = run("plain")
    mixed_class, mixed = run("mixed", mixup_alpha=0.2)
    limit_class, limit = run("limit", mixup_alpha=1e-9)  # lambda folded to 1: the batch itself
    assert plain_class is GroupDRO and mixed_class is limit_class is MixedGroupDRO
    assert all(torch.equal(limit[k], v) for k, v in plain.items())
    assert not all(torch.equal(mixed[k], v) for k, v in plain.items())


def test_vectorized_clients_give_the_sequential_first_losses_and_q(tmp_path):
    spec = parse_spec(make_spec({"name": "groupdro", "eta": 0.3}))
    engine = Engine.from_spec(spec, tmp_path)
    state = engine.initial_state()
    sequential = [engine.train_client(job) for job in engine.make_jobs(0, state, engine.holders)]
    executor = VectorizedExecutor(engine.algorithm, torch.device("cpu"), lambda line: None)
    jobs = engine.make_jobs(0, state, engine.holders)
    vectorized = executor.map(engine.train_client, jobs)
    assert executor.ran == {"vectorized"}
    for s, v in zip(sequential, vectorized, strict=True):
        assert v.stats.first_loss == pytest.approx(s.stats.first_loss, rel=1e-6)
        assert float(v.upload[LOG_Q]) == pytest.approx(0.3 * s.stats.first_loss, rel=1e-6)
    assert all(LOG_Q in job.client_state for job in jobs)


# --- config -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("algorithm", "message"),
    [
        ({"name": "groupdro", "eta": -0.01}, "algorithm.eta: "),
        ({"name": "groupdro", "eta": "high"}, "algorithm.eta: "),
        ({"name": "groupdro", "q": 1}, "algorithm.q"),
        ({"name": "groupdro", "mixup_alpha": 0}, "algorithm.mixup_alpha: "),
        (
            {"name": "groupdro", "mixup_alpha": 0.2, "vhl": {"generator": {"kind": "noise"}}},
            "algorithm.mixup_alpha: mixup replaces the local objective",
        ),
    ],
)
def test_bad_configs_are_refused_naming_the_field(algorithm, message):
    with pytest.raises(InputError, match=message):
        parse_spec(make_spec(algorithm))


def test_defaults_are_fedbrs_code_and_labels_name_eta():
    config = parse_spec(BASE).algorithm
    assert config.eta == 0.01 and config.label() == "GroupDRO"
    assert parse_spec(make_spec({"name": "groupdro", "eta": 0.1})).algorithm.label() == (
        "GroupDRO (eta=0.1)"
    )
    mixed = parse_spec(make_spec({"name": "groupdro", "mixup_alpha": 0.2})).algorithm
    assert mixed.label() == "GroupDRO (mixup=0.2)"
    assert "mixup_alpha" not in config.model_dump()  # off: absent, so no run's key changes


def cli(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(FEDHET), *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_cli_validates_and_trains_a_short_digits_run(fedhet, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(make_spec({"name": "groupdro", "eta": -1})))
    refused = cli("spec", "validate", bad, cwd=tmp_path)
    assert refused.returncode == 2
    lines = (refused.stdout + refused.stderr).strip().splitlines()
    assert len(lines) == 1 and "algorithm.eta" in lines[0] and "Traceback" not in lines[0]
    spec = tmp_path / "groupdro.yaml"
    spec.write_text(yaml.safe_dump(make_spec({"name": "groupdro"}, federation={"rounds": 2})))
    assert cli("spec", "validate", spec, cwd=tmp_path).returncode == 0
    # the training through the session's CLI process (conftest's `fedhet`: imports paid once)
    trained = fedhet("train", spec, "--store", tmp_path / "store", "--format", "json", cwd=tmp_path)
    assert trained.rc == 0, trained.stderr
    (row,) = json.loads(trained.stdout)
    assert row["algorithm"] == "GroupDRO" and 0 < row["final_pct"] <= 100
