"""MOON (Li et al., CVPR 2021) against its definition.

- The local loss, on a hand-built batch, is CE + mu * l_con with
  l_con = -log(e^(cos(z, z_glob)/tau) / (e^(cos(z, z_glob)/tau) + e^(cos(z, z_prev)/tau))),
  written here from the definition (cosines, exponentials and a logarithm by hand): two local
  SGD steps of the method equal two steps on that loss, with the client's previous local model
  (from its state) as the negative, for two temperatures.
- With mu = 0 (and no projection head) MOON is FedAvg bit for bit.
- The previous model is the client's own model of its last participation, the global model
  before its first; config validation; a short training on digits.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedhet.core.errors import InputError
from fedhet.core.rng import torch_generator
from fedhet.core.spec import Spec, parse_spec
from fedhet.data.clients import ClientData
from fedhet.engine.loop import Engine
from fedhet.engine.setup import build_setup
from fedhet.engine.trainer import ClientJob
from fedhet.methods.moon.algorithm import PREVIOUS

torch.set_num_threads(1)
FEDHET = Path(sys.executable).parent / "fedhet"
BATCH = 6


def spec_for(algorithm: dict, **federation) -> Spec:
    return parse_spec(
        {
            "seed": 2,
            "data": {"dataset": "digits"},
            "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.5},
            "model": {"arch": "mlp", "hidden": [16]},
            "federation": {"rounds": 3, "batch_size": 32, "lr": 0.05, "local_steps": 3}
            | federation,
            "algorithm": algorithm,
            "runtime": {"progress": False, "clients": "sequential"},
        }
    )


def moon_spec(algorithm: dict | None = None, **federation) -> Spec:
    return spec_for({"name": "moon", "projection_width": 12} | (algorithm or {}), **federation)


def perturbed(state: dict, scale: float, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {n: v + scale * torch.randn(v.shape, generator=gen) for n, v in state.items()}


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum(1) / (a.pow(2).sum(1).sqrt() * b.pow(2).sum(1).sqrt())


def defined_loss(model, global_model, previous_model, x, y, mu: float, tau: float):
    """CE + mu * mean l_con, from the definition."""
    z = model.features(x)
    with torch.no_grad():
        z_glob, z_prev = global_model.features(x), previous_model.features(x)
    positive = torch.exp(cosine(z, z_glob) / tau)
    negative = torch.exp(cosine(z, z_prev) / tau)
    l_con = -torch.log(positive / (positive + negative))
    logits = model.head(z)
    ce = -(logits - torch.log(torch.exp(logits).sum(1, keepdim=True)))[torch.arange(len(y)), y]
    return ce.mean() + mu * l_con.mean()


@pytest.mark.parametrize("tau", [0.5, 0.1])
def test_the_local_loss_is_its_definition_with_the_previous_model_as_negative(tmp_path, tau):
    mu, lr, steps = 2.0, 0.1, 2
    spec = moon_spec({"mu": mu, "temperature": tau}, batch_size=BATCH, local_steps=steps)
    setup = build_setup(spec)
    trainer = spec.algorithm.trainer_class()(spec.algorithm, setup)
    model = trainer.build_model()
    global_state = {n: v.clone() for n, v in model.state_dict().items()}
    previous = perturbed(global_state, 0.3, seed=1)  # the client's model of its last round
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(BATCH, *setup.clients[0].x.shape[1:], generator=gen)  # a hand-built batch
    y = torch.tensor([0, 3, 3, 5, 9, 1])
    client = ClientData(0, x, y)  # the batch is the client's data: every step takes it whole
    job = ClientJob(
        0, client, model, global_state, {}, {PREVIOUS + n: v for n, v in previous.items()},
        trainer.client_sgd(0, client, lr), torch_generator(0, "test"), steps,
    )  # fmt: skip
    result = trainer.client_update(job)

    # the same two SGD steps on the loss written from the definition
    mine, glob, prev = (trainer.build_model() for _ in range(3))
    mine.load_state_dict(global_state)
    glob.load_state_dict(global_state)
    prev.load_state_dict(previous)
    optimizer = torch.optim.SGD(mine.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = defined_loss(mine, glob, prev, x, y, mu, tau)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    for name, value in mine.state_dict().items():
        torch.testing.assert_close(result.state[name], value, rtol=1e-5, atol=1e-6)
    assert result.stats.mean_loss == pytest.approx(sum(losses) / steps, rel=1e-5)
    # the terms are live: the previous model as negative, and the temperature, change the loss
    mine.load_state_dict(result.state)
    with torch.no_grad():
        with_global = float(defined_loss(mine, glob, glob, x, y, mu, tau))
        other_tau = float(defined_loss(mine, glob, prev, x, y, mu, 2 * tau))
        at_result = float(defined_loss(mine, glob, prev, x, y, mu, tau))
    assert abs(with_global - at_result) > 1e-3 and abs(other_tau - at_result) > 1e-3
    # the trained model is kept as the client's next previous model
    kept = {n[len(PREVIOUS) :]: v for n, v in job.client_state.items() if n.startswith(PREVIOUS)}
    assert kept.keys() == result.state.keys()
    assert all(torch.equal(kept[n], result.state[n]) for n in kept)


def test_without_a_previous_model_the_global_model_is_the_negative(tmp_path):
    """A client's first round: z_prev = z_glob, so l_con is log 2 (and has no gradient)."""
    engine = Engine.from_spec(moon_spec(), tmp_path)
    state = engine.initial_state()
    (job,) = engine.make_jobs(0, state, [1])
    job.model.load_state_dict(job.global_state)
    assert engine.algorithm.previous_state(job) is job.global_state
    anchors = engine.algorithm.anchors(job)
    x = engine.setup.clients[1].x[:8]
    z = job.model.features(x)
    z_glob, z_prev = anchors.global_model.features(x), anchors.previous_model.features(x)
    assert torch.equal(z_glob, z_prev)
    positive = torch.exp(cosine(z, z_glob) / 0.5)
    l_con = -torch.log(positive / (positive + torch.exp(cosine(z, z_prev) / 0.5)))
    torch.testing.assert_close(l_con, torch.full_like(l_con, 0.6931472))


def test_mu_zero_is_fedavg_bit_for_bit(tmp_path):
    federation = {"clients_per_round": 3, "momentum": 0.5, "lr_decay": 0.9}
    moon = Engine.from_spec(
        moon_spec({"mu": 0, "projection": "none"}, **federation), tmp_path / "m"
    )
    fedavg = Engine.from_spec(spec_for({"name": "fedavg"}, **federation), tmp_path / "f")
    ran_moon, ran_fedavg = moon.run(), fedavg.run()
    assert ran_moon.global_state.keys() == ran_fedavg.global_state.keys()
    for name, value in ran_fedavg.global_state.items():
        assert torch.equal(ran_moon.global_state[name], value), name
    for metric in ("test_accuracy", "test_loss", "train_loss"):
        assert ran_moon.metrics[metric] == ran_fedavg.metrics[metric], metric
    # and mu > 0 changes training once clients hold previous models (the term is live)
    other = Engine.from_spec(
        moon_spec({"mu": 5, "projection": "none"}, **federation), tmp_path / "o"
    )
    trained = other.run()
    assert any(
        not torch.equal(trained.global_state[n], v) for n, v in ran_fedavg.global_state.items()
    )


def test_a_short_training_on_digits_learns_and_keeps_previous_models(tmp_path):
    spec = moon_spec({"projection_width": 32}, rounds=6, lr=0.1, momentum=0.9, local_steps=5)
    engine = Engine.from_spec(spec, tmp_path)
    state = engine.run()
    accuracy = state.metrics["test_accuracy"]  # chance is 0.1 (the projection head slows it)
    assert all(0 <= a <= 1 for a in accuracy) and accuracy[-1] > 0.2, accuracy
    assert set(state.client_states) == {0, 1, 2, 3}
    model_names = set(engine.algorithm.build_model().state_dict())
    assert any(n.startswith("features.projection.") for n in model_names)  # the head is there
    for client_state in state.client_states.values():
        assert {n[len(PREVIOUS) :] for n in client_state} == model_names
    assert state.metrics["bytes_up"][-1] > 0  # the model is exchanged as FedAvg's


@pytest.mark.parametrize(
    ("algorithm", "message"),
    [
        ({"mu": -0.1}, "algorithm.mu: input should be greater than or equal to 0"),
        ({"temperature": 0}, "algorithm.temperature: input should be greater than 0"),
        ({"projection": "linear"}, "algorithm.projection: input should be 'mlp' or 'none'"),
        ({"projection_width": 0}, "algorithm.projection_width: input should be greater than"),
    ],
)
def test_bad_values_are_refused_naming_the_field(algorithm, message):
    with pytest.raises(InputError, match=message):
        moon_spec(algorithm)


def test_defaults_are_the_papers():
    config = parse_spec({"algorithm": {"name": "moon"}}).algorithm
    assert (config.mu, config.temperature, config.projection) == (1.0, 0.5, "mlp")
    assert config.projection_width == 256 and config.label() == "MOON"


def test_spec_validate_through_the_installed_cli(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(
        "name: m\ndata: {dataset: digits}\nmodel: {arch: mlp, hidden: [8]}\n"
        "algorithm: {name: moon, mu: 0.01, temperature: 0.5}\n"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("temperature: 0.5", "temperature: -1"))
    ok = subprocess.run([FEDHET, "spec", "validate", good], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    refused = subprocess.run([FEDHET, "spec", "validate", bad], capture_output=True, text=True)
    assert refused.returncode == 2
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    assert "algorithm.temperature: input should be greater than 0" in refused.stderr
