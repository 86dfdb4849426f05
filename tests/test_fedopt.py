"""The FedOpt family (fedadam, fedyogi, fedadagrad, fedavgm) against its definition.

- Limits: each with server lr 1 and no momentum or adaptivity IS FedAvg, bit for bit, round
  after round (global states compared with torch.equal), in both executors:
      fedavgm     eta 1, momentum 0                 u = Delta
      fedadam     eta 1, beta1 0, beta2 1, tau 1/2  v stays tau^2: u = Delta / (1/2 + 1/2)
      fedyogi     the same
      fedadagrad  eta 2^21, beta1 0, tau 2^20       v = 2^40 + sum Delta^2 rounds to 2^40 in
                                                    float32: u = 2^21 Delta / 2^21
- The server step on hand-built client models equals an optimizer written independently
  (torch.optim.SGD / Adagrad / Adam, or Reddi et al. Alg. 2 by hand) applied to the
  pseudo-gradient x - (weighted average), over several rounds; buffers are plainly averaged.
- Checkpoint and resume continue the optimizer's state bit for bit; configs are validated.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import spec_data

from fedhet.core.errors import InputError
from fedhet.core.spec import parse_spec
from fedhet.engine import tensors
from fedhet.engine.local import LocalStats
from fedhet.engine.loop import Engine
from fedhet.engine.trainer import ClientResult

torch.set_num_threads(1)

BASE = {
    "seed": 5,
    "data": {"dataset": "digits"},
    "partition": {"scheme": "dirichlet", "clients": 5, "alpha": 0.5},
    "model": {"arch": "mlp", "hidden": [8]},
    "federation": {
        "rounds": 3,
        "batch_size": 32,
        "lr": 0.05,
        "lr_decay": 0.9,
        "local_steps": 3,
        "clients_per_round": 3,
    },
    "algorithm": {"name": "fedavg"},
    "runtime": {"threads": 1, "progress": False, "device": "cpu"},
}
BN_MLP = {"arch": "mlp", "hidden": [8], "norm": "batch"}  # BatchNorm buffers to average
LIMITS = {
    "fedavgm": {"server_lr": 1.0, "server_momentum": 0.0},
    "fedadam": {"server_lr": 1.0, "beta1": 0.0, "beta2": 1.0, "tau": 0.5},
    "fedyogi": {"server_lr": 1.0, "beta1": 0.0, "beta2": 1.0, "tau": 0.5},
    "fedadagrad": {"server_lr": 2.0**21, "beta1": 0.0, "tau": 2.0**20},
}


def make_spec(algorithm: dict, **sections):
    return parse_spec(spec_data(BASE, algorithm, **sections))


def rounds_of(spec, folder: Path) -> tuple[Engine, list[dict]]:
    """The engine and the global state after each round."""
    engine = Engine.from_spec(spec, folder)
    state, states = engine.initial_state(), []
    for rnd in range(spec.federation.rounds):
        engine.run_round(rnd, state)
        states.append(tensors.clone(state.global_state))
    return engine, states


# --- limits: FedAvg, bit for bit ----------------------------------------------------------


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
@pytest.mark.parametrize("name", LIMITS)
def test_server_lr_one_without_momentum_or_adaptivity_is_fedavg(tmp_path, name, executor):
    # sequential on a BatchNorm model (its buffers averaged); vectorized runs no BatchNorm
    model = {"model": BN_MLP} if executor == "sequential" else {}
    runtime = {"runtime": {"clients": executor}}
    fedavg = make_spec({"name": "fedavg"}, **model, **runtime)
    limit = make_spec({"name": name, **LIMITS[name]}, **model, **runtime)
    _, expected = rounds_of(fedavg, tmp_path / "fedavg")
    engine, got = rounds_of(limit, tmp_path / name)
    if executor == "vectorized":
        assert engine.executor.ran == {"vectorized"}
    start = engine.algorithm.build_model().state_dict()
    assert tensors.distance(expected[-1], start) > 0.1  # the rounds moved the model
    if executor == "sequential":
        assert any(n.endswith("running_mean") for n in expected[-1])
    for rnd, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert want.keys() == have.keys()
        for key, value in want.items():
            assert torch.equal(have[key], value), f"round {rnd + 1}: {key} differs from FedAvg"


@pytest.mark.parametrize(
    "algorithm",
    [
        {"name": "fedavgm", "server_lr": 1.0, "server_momentum": 0.5},
        {"name": "fedadam", "server_lr": 1.0, "beta1": 0.0, "beta2": 0.99, "tau": 0.5},
        {"name": "fedyogi", "server_lr": 1.0, "beta1": 0.5, "beta2": 1.0, "tau": 0.5},
        {"name": "fedadagrad", "server_lr": 0.1, "beta1": 0.0, "tau": 0.05},
    ],
    ids=lambda a: a["name"],
)
def test_leaving_the_limit_leaves_fedavg(tmp_path, algorithm):
    """The limit test can fail: one hyperparameter off its limit and the models differ."""
    _, expected = rounds_of(make_spec({"name": "fedavg"}), tmp_path / "fedavg")
    _, got = rounds_of(make_spec(algorithm), tmp_path / "other")
    assert any(not torch.equal(got[-1][k], v) for k, v in expected[-1].items())


# --- the server step against independent optimizers -----------------------------------------


def clients_around(x: dict, rnd: int, gen: torch.Generator) -> tuple[list[dict], list[float]]:
    """Three hand-built client models x + noise (a different scale per tensor and round; integer
    buffers kept) and random weights summing to 1."""
    clients = []
    for _ in range(3):
        state = {}
        for name, value in x.items():
            scale = 10.0 ** (-3 + (rnd + len(name)) % 3)
            noise = scale * torch.randn(value.shape, generator=gen)
            state[name] = value + noise if value.is_floating_point() else value.clone()
        clients.append(state)
    raw = torch.rand(3, generator=gen, dtype=torch.float64) + 0.1
    return clients, (raw / raw.sum()).tolist()


def run_server(trainer, reference, rounds: int = 4) -> None:
    """Our aggregate over hand-built rounds against `reference(x, g)`, an optimizer written
    independently that takes the pseudo-gradient g = x - average and returns x+."""
    gen = torch.Generator().manual_seed(11)
    x = trainer.build_model().state_dict()
    server = trainer.init_server_state(x)
    ref = {n: v.clone() for n, v in x.items() if n in trainer.param_names}
    for rnd in range(rounds):
        clients, weights = clients_around(x, rnd, gen)
        stats = LocalStats(steps=1, mean_loss=0.0)
        results = [ClientResult(i, s, 10, stats) for i, s in enumerate(clients)]
        averaged = tensors.weighted_average(clients, weights)
        # the same pseudo-gradient for both (the adaptive steps amplify rounding differences)
        ref = reference(ref, {n: x[n] - averaged[n] for n in ref})
        new = trainer.aggregate(rnd, x, server, results, weights)
        for name, value in new.items():
            if name in trainer.param_names:
                torch.testing.assert_close(value, ref[name], rtol=2e-5, atol=1e-7)
            else:  # buffers: FedAvg's average, exactly
                assert torch.equal(value, averaged[name])
        assert tensors.distance(new, averaged) > 1e-4  # not FedAvg: the server's step shows
        x = new
    assert int(server["step"]) == rounds


def trainer_for(tmp_path, algorithm: dict):
    return Engine.from_spec(make_spec(algorithm, model=BN_MLP), tmp_path).algorithm


def torch_optimizer(make):
    """reference(x, g) driving a torch.optim optimizer over parameters that track x."""
    params: dict[str, torch.nn.Parameter] = {}
    optimizer = None

    def step(x, g):
        nonlocal optimizer
        if optimizer is None:
            params.update({n: torch.nn.Parameter(v.clone()) for n, v in x.items()})
            optimizer = make(list(params.values()))
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(x[n])
                p.grad = g[n].clone()
        optimizer.step()
        return {n: p.detach().clone() for n, p in params.items()}

    return step


def alg2(name: str, lr: float, beta1: float, beta2: float, tau: float, keras: bool = False):
    """Reddi et al. Alg. 2 written out (Keras's bias-corrected step size where `keras`)."""
    m: dict[str, torch.Tensor] = {}
    v: dict[str, torch.Tensor] = {}
    t = 0

    def step(x, g):
        nonlocal t
        t += 1
        out = {}
        for n, gn in g.items():
            delta = -gn
            m[n] = beta1 * m.get(n, torch.zeros_like(delta)) + (1 - beta1) * delta
            prev = v.get(n, torch.full_like(delta, 0.0 if keras else tau**2))
            if name == "fedadam":
                v[n] = beta2 * prev + (1 - beta2) * delta**2
            elif name == "fedyogi":
                v[n] = prev - (1 - beta2) * delta**2 * torch.sign(prev - delta**2)
            else:
                v[n] = prev + delta**2
            eta = lr
            if keras and name != "fedadagrad":
                eta = lr * math.sqrt(1 - beta2**t) / (1 - beta1**t)
            out[n] = x[n] + eta * m[n] / (torch.sqrt(v[n]) + tau)
        return out

    return step


def test_fedavgm_is_sgd_with_momentum_on_the_pseudo_gradient(tmp_path):
    trainer = trainer_for(tmp_path, {"name": "fedavgm", "server_lr": 0.7})
    run_server(trainer, torch_optimizer(lambda p: torch.optim.SGD(p, lr=0.7, momentum=0.9)))


@pytest.mark.parametrize("form", ["paper", "keras"])
def test_fedadagrad_is_torch_adagrad_on_the_pseudo_gradient(tmp_path, form):
    """Keras's and torch's Adagrad are the same update; v_{-1} is tau^2 (paper) or 0 (Keras)."""
    trainer = trainer_for(tmp_path, {"name": "fedadagrad", "server_lr": 0.3, "form": form})
    start = 1e-6 if form == "paper" else 0.0
    run_server(
        trainer,
        torch_optimizer(
            lambda p: torch.optim.Adagrad(p, lr=0.3, eps=1e-3, initial_accumulator_value=start)
        ),
    )


@pytest.mark.parametrize("form", ["paper", "keras"])
@pytest.mark.parametrize("name", ["fedadam", "fedyogi", "fedadagrad"])
def test_adaptive_steps_are_reddi_algorithm_2(tmp_path, name, form):
    algorithm = {"name": name, "server_lr": 0.05, "beta1": 0.8, "tau": 1e-2, "form": form}
    if name != "fedadagrad":
        algorithm["beta2"] = 0.95
    trainer = trainer_for(tmp_path, algorithm)
    run_server(trainer, alg2(name, 0.05, 0.8, 0.95, 1e-2, keras=form == "keras"))


def test_fedadam_in_keras_form_is_torch_adam_when_tau_is_negligible(tmp_path):
    """torch.optim.Adam bias-corrects as Keras does, but scales its eps by sqrt(1 - beta2^t):
    with tau far below sqrt(v) the two agree."""
    algorithm = {"name": "fedadam", "server_lr": 0.01, "form": "keras", "tau": 1e-12}
    trainer = trainer_for(tmp_path, algorithm)
    adam = torch_optimizer(lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.9, 0.99), eps=1e-12))
    run_server(trainer, adam)


def test_paper_form_has_no_bias_correction(tmp_path):
    """Alg. 2's first FedAdam step is eta (1 - beta1) Delta / (sqrt(beta2 tau^2 + (1 - beta2)
    Delta^2) + tau), not Adam's bias-corrected eta Delta / (|Delta| + tau)."""
    trainer = trainer_for(tmp_path, {"name": "fedadam"})
    x = trainer.build_model().state_dict()
    delta = {n: torch.full_like(x[n], 0.01) for n in trainer.param_names}
    u = trainer.optimizer.update(delta, trainer.init_server_state(x))
    expected = 0.1 * 0.1 * 0.01 / (math.sqrt(0.99e-6 + 0.01 * 1e-4) + 1e-3)
    for value in u.values():
        torch.testing.assert_close(value, torch.full_like(value, expected))


# --- state across checkpoints, and training ------------------------------------------------


@pytest.mark.parametrize("name", ["fedadam", "fedavgm"])
def test_resume_from_a_checkpoint_continues_the_server_optimizer_bit_for_bit(tmp_path, name):
    every = {"checkpoint_every": 1}
    spec = make_spec({"name": name}, runtime=every)
    straight = Engine.from_spec(spec, tmp_path / "straight").run()
    folder = tmp_path / "resumed"  # a 2-round run keeps its checkpoint after round 1 only
    Engine.from_spec(
        make_spec({"name": name}, federation={"rounds": 2}, runtime=every), folder
    ).run()
    assert [p.name for p in folder.glob("ckpt-*")] == ["ckpt-000001.zarr"]
    resumed = Engine.from_spec(spec, folder).run()
    assert straight.server_state.keys() == resumed.server_state.keys()
    assert int(resumed.server_state["step"]) == 3
    for state in ("global_state", "server_state"):
        for key, value in getattr(straight, state).items():
            assert torch.equal(getattr(resumed, state)[key], value), f"{state}[{key}]"


@pytest.mark.parametrize("name", ["fedadam", "fedyogi", "fedadagrad", "fedavgm"])
def test_each_trains_on_digits_with_its_defaults(tmp_path, name):
    spec = make_spec(
        {"name": name}, model={"hidden": [16]}, federation={"rounds": 5, "local_steps": 5}
    )
    state = Engine.from_spec(spec, tmp_path).run()
    accuracy = state.metrics["test_accuracy"]
    assert len(accuracy) == 5 and all(math.isfinite(a) for a in accuracy)
    assert max(accuracy) > 0.3  # chance is 0.1
    assert state.server_state.keys() >= {"step", "m.head.weight"}
    assert ("v.head.weight" in state.server_state) == (name != "fedavgm")


# --- validation ------------------------------------------------------------------------------


def test_defaults_are_the_papers_and_tcts():
    adam = parse_spec({"algorithm": {"name": "fedadam"}}).algorithm
    assert (adam.server_lr, adam.beta1, adam.beta2, adam.tau, adam.form) == (
        0.1,
        0.9,
        0.99,
        1e-3,
        "paper",
    )
    adagrad = parse_spec({"algorithm": {"name": "fedadagrad"}}).algorithm
    assert (adagrad.server_lr, adagrad.beta1, adagrad.tau) == (0.1, 0.0, 1e-3)
    avgm = parse_spec({"algorithm": {"name": "fedavgm"}}).algorithm
    assert (avgm.server_lr, avgm.server_momentum) == (1.0, 0.9)


@pytest.mark.parametrize(
    "algorithm, message",
    [
        (
            {"name": "fedadam", "server_lr": 0},
            "algorithm.server_lr: input should be greater than 0",
        ),
        ({"name": "fedyogi", "beta1": 1}, "algorithm.beta1: input should be less than 1"),
        ({"name": "fedadam", "beta2": 1.01}, "algorithm.beta2: input should be less than or equal"),
        ({"name": "fedadagrad", "tau": -1e-3}, "algorithm.tau: input should be greater than 0"),
        ({"name": "fedavgm", "server_momentum": 1.0}, "algorithm.server_momentum: input should"),
        ({"name": "fedadam", "server_lr": float("nan")}, "algorithm.server_lr: input should be"),
        (
            {"name": "fedadagrad", "beta2": 0.9},
            "algorithm.beta2: applies to algorithm fedadam, fedyogi only",
        ),
        (
            {"name": "fedadam", "server_momentum": 0.9},
            "algorithm.server_momentum: applies to algorithm fedavgm only",
        ),
        (
            {"name": "fedavgm", "tau": 0.1},
            "algorithm.tau: applies to algorithm fedadagrad, fedadam, fedyogi",
        ),
        ({"name": "fedyogi", "form": "torch"}, "algorithm.form: input should be 'paper' or"),
        (
            {"name": "fedadam", "form": "keras", "beta2": 1.0},
            "algorithm.beta2: 1 with form: keras makes fedadam's bias-corrected step size",
        ),
    ],
)
def test_bad_configs_are_refused_naming_the_field(algorithm, message):
    with pytest.raises(InputError, match="^spec: " + message.replace("(", "\\(")):
        parse_spec({"algorithm": algorithm})


def test_spec_validate_through_the_installed_cli(tmp_path):
    cli = Path(sys.executable).with_name("fedhet")
    spec = {**{k: BASE[k] for k in ("name", "data") if k in BASE}, "name": "fedopt"}
    spec["algorithm"] = {"name": "fedyogi", "beta2": 2}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec))
    bad = subprocess.run([cli, "spec", "validate", path], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    (line,) = bad.stderr.strip().splitlines()
    assert "algorithm.beta2: input should be less than or equal to 1 (got 2)" in line
    spec["matrix"] = {"algorithm": [{"name": n} for n in LIMITS]}
    del spec["algorithm"]
    path.write_text(yaml.safe_dump(spec))
    good = subprocess.run([cli, "spec", "validate", path], capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    assert "valid (4 runs)" in good.stdout
