"""System heterogeneity in the round loop (`federation.system`): every client trains the steps
its plan gives it, the round aggregates the clients that reported, weights renormalized over
them, and the methods see the work actually done. Checked against the definitions written out
here by hand:

    FedNova:  tau_i = the plan's steps, a_i = sum_{k<tau_i} (1 - rho^(k+1)) / (1 - rho),
              p_i = n_i / sum_{j reported} n_j, d_i = (x - y_i) / a_i,
              x+ = x - tau_eff sum_i p_i d_i,  tau_eff = sum_i p_i a_i
    SCAFFOLD: c_i+ = c_i - c + (x - y_i) / (tau_i lr) for the reporters (after_step form, no
              momentum); a dropped client's c_i unchanged; c = sum_i (n_i / n) c_i over all
    FedAvg:   x+ = sum_{i reported} p_i y_i

with y_i the client's tau_i SGD steps from x over the first tau_i batches of its schedule.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from conftest import TINY_SPEC, CliRunner, write_spec

from fedhet.core.rng import torch_generator
from fedhet.core.spec import Spec, parse_spec
from fedhet.engine import system, tensors
from fedhet.engine.local import batch_schedule
from fedhet.engine.loop import Checkpoints, Engine
from fedhet.engine.run_format import METRICS

torch.set_num_threads(1)
CPU = torch.device("cpu")
CLIENTS = 6
LR = 0.1


def make_spec(algorithm: dict[str, Any], system_section: dict[str, Any] | None, **fed: Any) -> Spec:
    return parse_spec(
        {
            "seed": 5,
            "partition": {"scheme": "dirichlet", "clients": CLIENTS, "alpha": 0.5},
            "model": {"arch": "mlp", "hidden": [8]},
            "federation": {
                "rounds": 3,
                "clients_per_round": 5,
                "batch_size": 32,
                "lr": LR,
                "system": system_section,
                **fed,
            },
            "algorithm": algorithm,
            "runtime": {"progress": False},
        }
    )


def replay(engine: Engine, x: dict, cid: int, rnd: int, steps: int) -> dict:
    """y_i: `steps` plain SGD steps from x on the first `steps` batches of the client's schedule."""
    fed, client = engine.spec.federation, engine.setup.clients[cid]
    model = engine.algorithm.build_model()
    model.load_state_dict(x)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=fed.momentum)
    generator = torch_generator(engine.spec.seed, "local", rnd, cid)
    for idx in batch_schedule(client.n, fed.batch_size, steps, generator):
        optimizer.zero_grad()
        F.cross_entropy(model(client.x[idx]), client.y[idx]).backward()
        optimizer.step()
    return tensors.clone(model.state_dict())


def assert_states_close(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for name, value in actual.items():
        torch.testing.assert_close(value, expected[name], rtol=1e-5, atol=1e-6)


# Work redrawn per client and round, a deadline that cuts the slow clients short, and dropout
UNEQUAL_WORK = {
    "local_steps": {"low": 2, "high": 9},
    "dropout": 0.3,
    "speed": [0.5, 1.0],
    "deadline": 8,
}


def test_fednova_aggregate_under_unequal_work_is_its_definition(tmp_path):
    momentum = 0.5
    engine = Engine.from_spec(
        make_spec({"name": "fednova"}, UNEQUAL_WORK, momentum=momentum), tmp_path
    )
    state = engine.initial_state()
    x = tensors.clone(state.global_state)
    plan = engine.plan(0)
    fed = engine.spec.federation
    seed, sizes = engine.spec.seed, engine.setup.sizes
    full = {c: system.local_steps(fed, seed, 0, c, sizes[c]) for c in plan.reported}
    assert plan.dropped and len(plan.reported) >= 3  # the round has drops and reporters,
    assert len(set(plan.steps.values())) > 1  # unequal work,
    assert any(plan.steps[c] < full[c] for c in plan.reported)  # and a client cut at the deadline
    engine.run_round(0, state)

    total = sum(sizes[c] for c in plan.reported)
    p = {c: sizes[c] / total for c in plan.reported}
    a = {
        c: sum((1 - momentum ** (k + 1)) / (1 - momentum) for k in range(plan.steps[c]))
        for c in plan.reported
    }
    y = {c: replay(engine, x, c, 0, plan.steps[c]) for c in plan.reported}
    tau_eff = sum(p[c] * a[c] for c in plan.reported)
    expected = {
        name: x[name] - tau_eff * sum(p[c] * (x[name] - y[c][name]) / a[c] for c in plan.reported)
        for name in x
    }
    assert_states_close(state.global_state, expected)
    fedavg = {name: sum(p[c] * y[c][name] for c in plan.reported) for name in x}
    gap = max(float((fedavg[n] - expected[n]).abs().max()) for n in x)
    assert gap > 1e-3  # unequal work: FedNova's aggregate is not FedAvg's
    assert state.metrics["clients_reported"] == [len(plan.reported)]
    assert state.metrics["mean_local_steps"] == [sum(plan.steps.values()) / len(plan.reported)]


def test_fedavg_aggregates_the_reporters_only(tmp_path):
    engine = Engine.from_spec(make_spec({"name": "fedavg"}, UNEQUAL_WORK), tmp_path)
    state = engine.initial_state()
    x = tensors.clone(state.global_state)
    plan = engine.plan(0)
    assert plan.dropped
    engine.run_round(0, state)
    sizes = engine.setup.sizes
    total = sum(sizes[c] for c in plan.reported)
    y = {c: replay(engine, x, c, 0, plan.steps[c]) for c in plan.reported}
    expected = {name: sum(sizes[c] / total * y[c][name] for c in plan.reported) for name in x}
    assert_states_close(state.global_state, expected)
    assert state.metrics["clients_sampled"] == [len(plan.sampled)]
    assert state.metrics["clients_dropped"] == [len(plan.dropped)]


def test_scaffold_controls_use_the_steps_done_and_a_dropped_client_keeps_its_own(tmp_path):
    engine = Engine.from_spec(
        make_spec(
            {"name": "scaffold", "correction": "after_step"}, {**UNEQUAL_WORK, "dropout": 0.5}
        ),
        tmp_path,
    )
    state = engine.initial_state()
    x = tensors.clone(state.global_state)
    plan = engine.plan(0)
    engine.run_round(0, state)
    for c in plan.reported:  # round 0: c = c_i = 0, so c_i+ = (x - y_i) / (tau_i lr)
        y = replay(engine, x, c, 0, plan.steps[c])
        expected = {n: (x[n] - y[n]) / (plan.steps[c] * LR) for n in state.client_states[c]}
        assert_states_close(state.client_states[c], expected)
    assert set(state.client_states) == set(plan.reported)  # the dropped ones trained nothing

    before = {c: tensors.clone(s) for c, s in state.client_states.items()}
    later = engine.plan(1)
    kept = set(before) & set(later.dropped)
    assert kept  # a client with a control variate drops out of round 1
    engine.run_round(1, state)
    for c in kept:
        assert all(torch.equal(state.client_states[c][n], v) for n, v in before[c].items())
    sizes, total = engine.setup.sizes, sum(engine.setup.sizes)
    for name, c_value in state.server_state.items():  # c = sum_i p_i c_i over all clients
        expected = sum(sizes[c] / total * s[name] for c, s in state.client_states.items())
        torch.testing.assert_close(c_value, expected, rtol=1e-5, atol=1e-6)


def test_a_round_nobody_reports_keeps_every_state_and_says_so(tmp_path):
    engine = Engine.from_spec(make_spec({"name": "scaffold"}, {"dropout": 0.9}), tmp_path)
    state = engine.initial_state()
    engine.run_round(0, state)
    rnd = next(r for r in range(1, 40) if not engine.plan(r).reported)
    for r in range(1, rnd):
        engine.run_round(r, state)
    before = state.snapshot()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no mean of nothing
        engine.run_round(rnd, state)
    assert state.global_state is before.global_state
    for name, value in before.server_state.items():
        assert torch.equal(state.server_state[name], value)
    assert state.client_states.keys() == before.client_states.keys()
    assert all(state.client_states[c] is s for c, s in before.client_states.items())
    row = {name: values[-1] for name, values in state.metrics.items()}
    sampled = len(engine.plan(rnd).sampled)
    assert row["clients_reported"] == 0 and row["clients_dropped"] == sampled == 5
    assert math.isnan(row["train_loss"]) and math.isnan(row["divergence"])
    assert math.isnan(row["mean_local_steps"])
    assert row["bytes_up"] == 0
    model_and_control = 2 * tensors.nbytes(state.global_state)  # all parameters, no buffer
    assert row["bytes_down"] == sampled * model_and_control  # everyone sampled downloaded
    assert row["test_accuracy"] == state.metrics["test_accuracy"][-2]  # evaluated: the same model


def comparable(metrics: dict[str, list[float]]) -> dict[str, list[float]]:
    return {name: values for name, values in metrics.items() if name != "wall_time"}


def test_a_section_that_keeps_todays_work_gives_todays_results_and_adds_its_metrics(tmp_path):
    today = Engine.from_spec(
        make_spec({"name": "fednova"}, None, local_steps=4), tmp_path / "a"
    ).run()
    assert list(today.metrics) == list(METRICS)
    same = Engine.from_spec(
        make_spec({"name": "fednova"}, {"local_steps": 4}), tmp_path / "b"
    ).run()
    assert list(same.metrics) == [*METRICS, *system.METRICS]
    rest = {name: same.metrics[name] for name in system.METRICS}
    np.testing.assert_equal(comparable(same.metrics), comparable(today.metrics) | rest)
    assert same.metrics["mean_local_steps"] == [4.0] * 3
    assert same.metrics["clients_reported"] == same.metrics["clients_sampled"] == [5.0] * 3
    assert all(torch.equal(v, same.global_state[n]) for n, v in today.global_state.items())


def test_the_same_spec_gives_the_same_rounds_and_its_checkpoint_keeps_its_metrics(tmp_path):
    runs = [
        Engine.from_spec(make_spec({"name": "fedavg"}, UNEQUAL_WORK), tmp_path / str(i)).run()
        for i in range(2)
    ]
    np.testing.assert_equal(comparable(runs[0].metrics), comparable(runs[1].metrics))
    assert all(torch.equal(v, runs[1].global_state[n]) for n, v in runs[0].global_state.items())
    assert 0 < sum(runs[0].metrics["clients_dropped"]) < 15

    checkpoints = Checkpoints(tmp_path / "ckpt", CPU)
    checkpoints.save(runs[0])
    np.testing.assert_equal(comparable(checkpoints.latest().metrics), comparable(runs[0].metrics))


def test_centralized_training_refuses_the_section(fedhet: CliRunner, tmp_path):
    spec = {
        **TINY_SPEC,
        "algorithm": {"name": "centralized"},
        "federation": {**TINY_SPEC["federation"], "system": {"dropout": 0.1}},
    }
    result = fedhet("spec", "validate", write_spec(tmp_path / "central.yaml", spec))
    assert result.rc == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].count("federation.system") == 1
    assert "Traceback" not in result.stderr
