"""Clients' momentum: buffers kept across rounds (`federation.momentum_buffers: client`) against
one torch optimizer continued by hand, through a resume and a dropout, and the algorithm's own
momentum (`algorithm.local_momentum`) in place of federation's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_engine import (
    CPU,
    DIGITS,
    assert_states_equal,
    comparable,
    interrupted_and_resumed,
    make_spec,
    round_batches,
)

from fedhet.core.spec import parse_spec
from fedhet.engine.client_executors import client_executor
from fedhet.engine.executor import SequentialExecutor
from fedhet.engine.local import buffer_weight, effective_steps
from fedhet.engine.loop import Engine
from fedhet.models import build_model

ONE_CLIENT = {
    "partition": {"scheme": "iid", "clients": 1},
    "federation": {
        "rounds": 3,
        "batch_size": 256,
        "lr": 0.1,
        "lr_decay": 0.8,
        "momentum": 0.9,
        "weight_decay": 1e-3,
        "local_steps": 4,
        "momentum_buffers": "client",
    },
}


def continued_sgd(spec, x, y, steps: int) -> dict:
    """One torch SGD optimizer over every round's batches, its lr set per round."""
    fed = spec.federation
    model = build_model(spec.model, DIGITS.shape, DIGITS.num_classes, spec.seed)
    opt = torch.optim.SGD(
        model.parameters(), lr=fed.lr, momentum=fed.momentum, weight_decay=fed.weight_decay
    )
    for rnd in range(fed.rounds):
        opt.param_groups[0]["lr"] = fed.lr * fed.lr_decay**rnd
        for idx in round_batches(spec, rnd, len(y), steps):
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    return {k: v.detach() for k, v in model.named_parameters()}


def test_kept_buffers_continue_one_optimizer_across_rounds(tmp_path):
    engine = Engine.from_spec(make_spec(**ONE_CLIENT), tmp_path / "kept")
    setup, state = engine.setup, engine.run()
    client = setup.clients[0]
    expected = continued_sgd(setup.spec, client.x, client.y, steps=4)
    for name, value in expected.items():
        torch.testing.assert_close(state.global_state[name], value, rtol=1e-5, atol=1e-6)
    fed = {**ONE_CLIENT["federation"], "momentum_buffers": "reset"}
    reset = Engine.from_spec(
        make_spec(**{**ONE_CLIENT, "federation": fed}), tmp_path / "reset"
    ).run()
    assert not torch.allclose(reset.global_state["head.weight"], expected["head.weight"])
    # the stored weight of the buffer's gradients: w <- 0.9 w + 1, 12 steps from an empty buffer
    weight = float(state.client_states[0]["momentum_buffer_weight"])
    assert weight == pytest.approx(sum(0.9**k for k in range(12)))


def test_effective_steps_of_a_kept_buffer_are_its_displacement():
    """Under a constant gradient g, SGD with momentum rho from a buffer holding w0 g moves by
    lr a g, a = effective_steps(steps, rho, w0), and leaves buffer_weight(steps, rho, w0) g."""
    g, rho, lr, w0, steps = torch.tensor([0.3, -1.2]), 0.9, 0.1, 4.0, 5
    p = torch.zeros(2, requires_grad=True)
    opt = torch.optim.SGD([p], lr=lr, momentum=rho)
    opt.state[p]["momentum_buffer"] = w0 * g
    for _ in range(steps):
        opt.zero_grad()
        (p * g).sum().backward()
        opt.step()
    a = effective_steps(steps, rho, w0)
    assert a > effective_steps(steps, rho)  # the kept buffer moves further than a fresh one
    torch.testing.assert_close(-p.detach(), lr * a * g)
    torch.testing.assert_close(opt.state[p]["momentum_buffer"], buffer_weight(steps, rho, w0) * g)


BUFFERS = "federation.momentum_buffers: client"
KEPT = {
    "algorithm": {"name": "scaffold"},
    "federation": {
        "rounds": 4,
        "clients_per_round": 3,
        "batch_size": 64,
        "lr": 0.05,
        "momentum": 0.5,
        "momentum_buffers": "client",
        "system": {"dropout": 0.3},
    },
}


def test_a_resumed_run_with_kept_buffers_equals_an_uninterrupted_run(tmp_path):
    reference, saved, resumed = interrupted_and_resumed(KEPT, tmp_path)
    assert any("momentum_buffer_weight" in s for s in saved.client_states.values())
    assert comparable(resumed.metrics) == comparable(reference.metrics)
    assert_states_equal(resumed.global_state, reference.global_state)
    assert_states_equal(resumed.server_state, reference.server_state)
    assert resumed.client_states.keys() == reference.client_states.keys()
    for cid, kept in reference.client_states.items():
        assert_states_equal(resumed.client_states[cid], kept)


def test_a_client_that_does_not_report_keeps_its_buffer(tmp_path):
    engine = Engine.from_spec(make_spec(**KEPT), tmp_path)
    state = engine.run()
    last = engine.plan(KEPT["federation"]["rounds"] - 1)
    assert last.dropped  # the dropout leaves someone out of the last round
    before = Engine.from_spec(
        make_spec(**{**KEPT, "federation": {**KEPT["federation"], "rounds": 3}}), tmp_path / "b"
    ).run()
    for cid in last.dropped:
        assert_states_equal(state.client_states[cid], before.client_states[cid])
    for cid in last.reported:
        after, earlier = state.client_states[cid], before.client_states.get(cid, {})
        assert not torch.equal(after["momentum_buffer_weight"], earlier["momentum_buffer_weight"])


def test_fednova_with_kept_buffers_and_equal_work_is_fedavg(tmp_path):
    fed = {
        "rounds": 2,
        "batch_size": 64,
        "local_steps": 3,
        "momentum": 0.9,
        "momentum_buffers": "client",
    }
    runs = {
        name: Engine.from_spec(
            make_spec(algorithm={"name": name}, federation=fed), tmp_path / name
        ).run()
        for name in ("fedavg", "fednova")
    }
    for name, value in runs["fedavg"].global_state.items():
        torch.testing.assert_close(runs["fednova"].global_state[name], value)


# --- the algorithm's own momentum ----------------------------------------------------------


def test_local_momentum_replaces_federations(tmp_path):
    """FedNova (unequal local steps) reads the momentum in training and in its aggregation."""

    def run(name, momentum, **algorithm):
        federation = {"rounds": 2, "batch_size": 64, "momentum": momentum}
        spec = make_spec(algorithm={"name": "fednova", **algorithm}, federation=federation)
        return Engine.from_spec(spec, tmp_path / name).run()

    federations = run("federation", 0.9)
    own = run("own", 0.0, local_momentum=0.9)
    plain = run("plain", 0.0)
    assert comparable(own.metrics) == comparable(federations.metrics)
    assert_states_equal(own.global_state, federations.global_state)
    assert not torch.equal(plain.global_state["head.weight"], own.global_state["head.weight"])


def test_local_momentum_shows_in_the_label_and_only_when_set():
    set_ = parse_spec({"algorithm": {"name": "fedavg", "local_momentum": 0.9}}).algorithm
    unset = parse_spec({"algorithm": {"name": "fedavg"}}).algorithm
    assert (set_.label(), unset.label()) == ("FedAvg (momentum=0.9)", "FedAvg")
    assert "local_momentum" not in unset.model_dump() and set_.model_dump()["local_momentum"] == 0.9


def test_kept_buffers_train_clients_one_at_a_time(tmp_path):
    engine = Engine.from_spec(make_spec(**KEPT), tmp_path)
    trainer = engine.algorithm
    assert isinstance(client_executor("auto", trainer, CPU, print), SequentialExecutor)
    said: list[str] = []
    vectorized = client_executor("vectorized", trainer, CPU, said.append)
    jobs = engine.make_jobs(0, engine.initial_state(), [0, 1])
    assert vectorized.map(lambda job: job.client.id, jobs) == [0, 1]  # each job on its own
    assert said == ["clients: training sequentially, not vectorized (" + BUFFERS + ")"]
