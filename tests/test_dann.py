"""DANN as FedBR's federated baseline: the gradient reversal layer, the domains (the clients),
the alternating schedule of FedBR's code, lambda = 0 as FedAvg bit for bit, config validation,
and a short digits run through the installed CLI."""

from __future__ import annotations

import copy
import json
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
from fedhet.engine.loop import Engine
from fedhet.engine.trainer import ClientJob
from fedhet.methods.dann.algorithm import (
    UPDATES,
    reverse_gradient,
    trains_discriminator,
)
from fedhet.plugin import WithPart

torch.set_num_threads(1)
FEDHET = Path(sys.executable).with_name("fedhet")  # the installed console script

BASE = {
    "seed": 5,
    "data": {"dataset": "digits"},
    "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.5},
    "model": {"arch": "mlp", "hidden": [16]},
    "federation": {
        "rounds": 3,
        "clients_per_round": 3,
        "batch_size": 16,
        "lr": 0.05,
        "local_steps": 4,
        "momentum": 0.9,
        "weight_decay": 1e-3,
    },
    "algorithm": {"name": "dann"},
    # bitwise comparisons against the sequential executor
    "runtime": {"threads": 1, "progress": False, "device": "cpu", "clients": "sequential"},
}


def make_spec(algorithm: dict, **sections) -> dict:
    return spec_data(BASE, algorithm, **sections)


def train(tmp_path: Path, algorithm: dict, name: str) -> dict[str, torch.Tensor]:
    engine = Engine.from_spec(parse_spec(make_spec(algorithm)), tmp_path / name)
    return engine.run().global_state


def engine_for(tmp_path: Path, **algorithm) -> Engine:
    return Engine.from_spec(parse_spec(make_spec({"name": "dann", **algorithm})), tmp_path)


def one_step_job(engine: Engine, client: int, client_state: dict) -> ClientJob:
    state = engine.initial_state()
    model = engine.algorithm.build_model()
    model.load_state_dict(state.global_state)
    gen = torch_generator(engine.spec.seed, "local", 0, client)
    data = engine.setup.clients[client]
    sgd = engine.algorithm.client_sgd(0, data, 0.05)
    return ClientJob(0, data, model, state.global_state, {}, client_state, sgd, gen, 1)


# --- the gradient reversal layer -----------------------------------------------------------


@pytest.mark.parametrize("scale", [0.0, 0.3, 2.0])
def test_reversal_is_the_identity_forward_and_flips_and_scales_the_gradient(scale):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    head = torch.nn.Sequential(torch.nn.Linear(7, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    head = head.double()
    target = torch.tensor([0, 2, 1, 1, 0])
    reversed_x = reverse_gradient(x, scale)
    assert torch.equal(reversed_x, x)
    (plain,) = torch.autograd.grad(F.cross_entropy(head(x), target), x)
    (flipped,) = torch.autograd.grad(F.cross_entropy(head(reversed_x), target), x)
    assert torch.equal(flipped, -scale * plain)
    # the layer's Jacobian is -scale times the identity (its forward's, by finite differences)
    jacobian = torch.autograd.functional.jacobian(lambda v: reverse_gradient(v, scale), x)
    eye = torch.eye(x.numel(), dtype=x.dtype).view(*x.shape, *x.shape)
    assert torch.equal(jacobian, -scale * eye)
    if scale:  # the parameters behind the layer keep their own gradient, unflipped
        params = list(head.parameters())
        below = torch.autograd.grad(F.cross_entropy(head(x), target), params)
        above = torch.autograd.grad(
            F.cross_entropy(head(reverse_gradient(x, scale)), target), params
        )
        assert all(torch.equal(a, b) for a, b in zip(above, below, strict=True))


# --- lambda = 0 is FedAvg, bit for bit -----------------------------------------------------


def test_lambda_zero_trains_the_classifier_exactly_as_fedavg(tmp_path):
    fedavg = train(tmp_path, {"name": "fedavg"}, "fedavg")
    joint = train(tmp_path, {"name": "dann", "lam": 0.0, "schedule": "joint"}, "joint")
    no_disc_steps = train(tmp_path, {"name": "dann", "lam": 0.0, "d_steps_per_g": 0}, "nod")
    for state in (joint, no_disc_steps):
        assert {k.removeprefix("net.") for k in state if k.startswith("net.")} == set(fedavg)
        for name, value in fedavg.items():
            assert torch.equal(state[f"net.{name}"], value), name
    # not trivially: the domain classifier did train (joint), through a scale-0 reversal
    start = engine_for(tmp_path / "init").initial_state().global_state
    moved = [
        k for k in start if k.startswith("discriminator.") and not torch.equal(joint[k], start[k])
    ]
    assert moved
    # and any weight, or discriminator steps taking their turns, changes the classifier
    weighted = train(tmp_path, {"name": "dann", "lam": 0.5, "schedule": "joint"}, "weighted")
    turns = train(tmp_path, {"name": "dann", "lam": 0.0}, "turns")
    for other in (weighted, turns):
        assert not all(torch.equal(other[f"net.{k}"], v) for k, v in fedavg.items())


# --- the domains and the schedule of FedBR's code ------------------------------------------


def test_update_count_schedule_follows_fedbrs_code():
    # update_count % (1 + d) < d: with d = 1 the classifier steps first, then they alternate
    assert [trains_discriminator(c, 1) for c in range(1, 7)] == [False, True] * 3
    assert [trains_discriminator(c, 2) for c in range(1, 7)] == [True, False, True] * 2
    assert not any(trains_discriminator(c, 0) for c in range(1, 7))


def test_a_feature_step_ascends_the_domain_loss_of_the_clients_own_label(tmp_path):
    engine = engine_for(tmp_path, lam=0.7)
    model = engine.algorithm.build_model()
    assert isinstance(model, WithPart)
    assert model.discriminator[-1].out_features == 4  # one domain per client
    assert model.discriminator[0].out_features == 256  # FedBR's code's width
    client = 2
    job = one_step_job(engine, client, {})  # update 1: the features' and classifier's step
    idx = next(engine.algorithm.client_batches(one_step_job(engine, client, {})))
    x, y = job.client.x[idx], job.client.y[idx]
    before = copy.deepcopy(job.model)
    result = engine.algorithm.client_update(job)
    # by hand: d/dp [CE(h(phi(x)), y) - lam CE(D(phi(x)), client)], one SGD step (no buffer yet)
    net, disc = before.net, before.discriminator
    z = net.features(x)
    label = torch.full((len(x),), client)
    objective = F.cross_entropy(net.head(z), y) - 0.7 * F.cross_entropy(disc(z), label)
    params = dict(net.named_parameters())
    grads = torch.autograd.grad(objective, list(params.values()))
    for (name, p), g in zip(params.items(), grads, strict=True):
        expected = p.detach() - 0.05 * (g + 1e-3 * p.detach())
        torch.testing.assert_close(result.state[f"net.{name}"], expected, rtol=0, atol=1e-6)
    for name, p in disc.named_parameters():  # D held on the classifier's step
        assert torch.equal(result.state[f"discriminator.{name}"], p.detach())
    assert int(job.client_state[UPDATES]) == 1
    assert result.stats.first_loss == pytest.approx(
        float(F.cross_entropy(net(x), y).detach()), rel=1e-6
    )


def test_a_discriminator_step_moves_d_alone_and_the_count_carries_over_rounds(tmp_path):
    engine = engine_for(tmp_path, lam=0.7)
    client = 1
    job = one_step_job(engine, client, {UPDATES: torch.tensor(1)})  # update 2: D's turn
    idx = next(engine.algorithm.client_batches(one_step_job(engine, client, {})))
    x = job.client.x[idx]
    before = copy.deepcopy(job.model)
    result = engine.algorithm.client_update(job)
    for name, p in before.net.named_parameters():
        assert torch.equal(result.state[f"net.{name}"], p.detach())
    disc = before.discriminator
    label = torch.full((len(x),), client)
    loss = F.cross_entropy(disc(before.net.features(x).detach()), label)
    named = dict(disc.named_parameters())
    grads = torch.autograd.grad(loss, list(named.values()))
    for (name, p), g in zip(named.items(), grads, strict=True):  # plain SGD, no weight decay
        expected = p.detach() - 0.05 * g
        torch.testing.assert_close(
            result.state[f"discriminator.{name}"], expected, rtol=0, atol=1e-6
        )
    assert int(job.client_state[UPDATES]) == 2


# --- config -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"algorithm": {"name": "dann", "lam": -0.1}}, "algorithm.lam: "),
        ({"algorithm": {"name": "dann", "d_steps_per_g": -1}}, "algorithm.d_steps_per_g: "),
        ({"algorithm": {"name": "dann", "disc_width": 0}}, "algorithm.disc_width: "),
        ({"algorithm": {"name": "dann", "disc_lr": 0}}, "algorithm.disc_lr: "),
        ({"algorithm": {"name": "dann", "schedule": "both"}}, "algorithm.schedule: "),
        (
            {"algorithm": {"name": "dann", "schedule": "joint", "d_steps_per_g": 3}},
            "algorithm.d_steps_per_g: counts the steps of schedule: alternate",
        ),
        (
            {
                "partition": {"scheme": "iid", "clients": 1},
                "federation": {**BASE["federation"], "clients_per_round": 1},
            },
            "partition.clients must be at least 2",
        ),
        (
            {"federation": {**BASE["federation"], "momentum_buffers": "client"}},
            "federation.momentum_buffers: client is not supported by dann",
        ),
    ],
)
def test_bad_configs_are_refused_naming_the_field(change, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        parse_spec(copy.deepcopy(BASE) | change)


def test_defaults_are_fedbrs_code_and_the_labels_name_variants():
    config = parse_spec(BASE).algorithm
    assert (config.lam, config.schedule, config.d_steps_per_g, config.disc_width) == (
        0.01,
        "alternate",
        1,
        256,
    )
    assert config.label() == "DANN"
    assert parse_spec(make_spec({"name": "dann", "schedule": "joint"})).algorithm.label() == (
        "DANN (joint)"
    )


def cli(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(FEDHET), *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_cli_validates_and_trains_a_short_digits_run(fedhet, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(make_spec({"name": "dann", "lam": -1})))
    refused = cli("spec", "validate", bad, cwd=tmp_path)
    assert refused.returncode == 2
    lines = (refused.stdout + refused.stderr).strip().splitlines()
    assert len(lines) == 1 and "algorithm.lam" in lines[0] and "Traceback" not in lines[0]
    spec = tmp_path / "dann.yaml"
    spec.write_text(
        yaml.safe_dump(make_spec({"name": "dann", "lam": 0.1}, federation={"rounds": 2}))
    )
    assert cli("spec", "validate", spec, cwd=tmp_path).returncode == 0
    # the training through the session's CLI process (conftest's `fedhet`: imports paid once)
    trained = fedhet("train", spec, "--store", tmp_path / "store", "--format", "json", cwd=tmp_path)
    assert trained.rc == 0, trained.stderr
    (row,) = json.loads(trained.stdout)
    assert row["algorithm"] == "DANN (lambda=0.1)" and 0 < row["final_pct"] <= 100
