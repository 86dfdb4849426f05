"""The baselines' defining properties: FedProx's proximal term, FedNova's normalized averaging,
SCAFFOLD's control variates and its advantage over FedAvg on a convex non-iid problem."""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedhet.core.rng import torch_generator
from fedhet.core.spec import Spec, parse_spec
from fedhet.data.datasets import load_dataset
from fedhet.engine.local import effective_steps
from fedhet.engine.loop import Engine, evaluate
from fedhet.engine.run_format import Checkpoints, RunState
from fedhet.engine.setup import TrainSetup
from fedhet.engine.trainer import Trainer
from fedhet.models import build_model
from fedhet.process.interrupts import Interrupted

torch.set_num_threads(1)
DIGITS = load_dataset("digits")
FEDERATION = {"rounds": 3, "batch_size": 64, "lr": 0.05}


def make_spec(algorithm: dict, **sections) -> Spec:
    raw = {
        "seed": 1,
        "partition": {"scheme": "dirichlet", "clients": 5, "alpha": 0.3},
        "model": {"arch": "mlp", "hidden": [16]},
        "federation": FEDERATION,
        "algorithm": algorithm,
        "runtime": {"progress": False, "checkpoint_every": 1000},
        **sections,
    }
    return parse_spec(raw)


def run(folder: Path, algorithm: dict, **sections) -> RunState:
    return Engine.from_spec(make_spec(algorithm, **sections), folder).run()


def flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([state[k].reshape(-1) for k in sorted(state)])


# --- FedProx ------------------------------------------------------------------------------

MOMENTUM = {**FEDERATION, "momentum": 0.5}


def test_fedprox_with_mu_zero_is_fedavg_exactly(tmp_path):
    fedavg = run(tmp_path / "a", {"name": "fedavg"}, federation=MOMENTUM)
    fedprox = run(tmp_path / "b", {"name": "fedprox", "mu": 0.0}, federation=MOMENTUM)
    assert torch.equal(flat(fedprox.global_state), flat(fedavg.global_state))
    proximal = run(tmp_path / "c", {"name": "fedprox", "mu": 0.5}, federation=MOMENTUM)
    assert not torch.allclose(flat(proximal.global_state), flat(fedavg.global_state))


def test_fedprox_local_steps_follow_the_proximal_gradient(tmp_path):
    """One client: each step is w <- w - lr (grad CE + mu (w - w_global))."""
    mu, steps = 2.0, 5
    federation = {"rounds": 1, "batch_size": 128, "lr": 0.1, "local_steps": steps}
    spec = make_spec(
        {"name": "fedprox", "mu": mu},
        partition={"scheme": "iid", "clients": 1},
        federation=federation,
    )
    engine = Engine.from_spec(spec, tmp_path)
    setup, state = engine.setup, engine.run()
    model = build_model(setup.spec.model, DIGITS.shape, DIGITS.num_classes, setup.spec.seed)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    client, gen = setup.clients[0], torch_generator(setup.spec.seed, "local", 0, 0)
    perm = torch.randperm(client.n, generator=gen)
    for step in range(steps):
        idx = perm[step * 128 : (step + 1) * 128]
        loss = F.cross_entropy(model(client.x[idx]), client.y[idx])
        grads = torch.autograd.grad(loss, list(model.parameters()))
        with torch.no_grad():
            for (name, p), g in zip(model.named_parameters(), grads, strict=True):
                p -= 0.1 * (g + mu * (p - start[name]))
    for name, p in model.named_parameters():
        torch.testing.assert_close(state.global_state[name], p.detach(), rtol=1e-5, atol=1e-6)


# --- FedNova ------------------------------------------------------------------------------


def test_fednova_with_equal_local_steps_is_fedavg(tmp_path):
    federation = {**MOMENTUM, "local_steps": 4}  # equal steps, unequal client sizes
    fedavg = run(tmp_path / "a", {"name": "fedavg"}, federation=federation)
    fednova = run(tmp_path / "b", {"name": "fednova"}, federation=federation)
    torch.testing.assert_close(
        flat(fednova.global_state), flat(fedavg.global_state), rtol=1e-5, atol=1e-6
    )


class RecordingFedAvg(Trainer):
    def aggregate(self, round, global_state, server_state, results, weights):
        self.last = (global_state, results, weights)
        return super().aggregate(round, global_state, server_state, results, weights)


def test_fednova_with_unequal_steps_rescales_normalized_updates(tmp_path):
    """x <- x - tau_eff sum_i p_i (x - y_i) / a_i, a_i from the momentum (Wang et al. 2020)."""
    federation = {**MOMENTUM, "rounds": 1}  # one local epoch: steps grow with client size
    spec = make_spec({"name": "fedavg"}, federation=federation)
    engine = Engine.from_spec(spec, tmp_path / "a", trainer=RecordingFedAvg)
    fedavg = engine.run()
    x, results, p = engine.algorithm.last
    steps = [r.stats.steps for r in results]
    assert len(set(steps)) > 1
    a = [effective_steps(s, 0.5) for s in steps]
    rho, tau = 0.5, steps[0]  # closed form of sum_{k<tau} (1 - rho^(k+1)) / (1 - rho)
    assert a[0] == pytest.approx((tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho))
    tau_eff = sum(pi * ai for pi, ai in zip(p, a, strict=True))
    expected = {}
    for name, value in x.items():
        step = sum(
            pi * (value - r.state[name]) / ai for pi, ai, r in zip(p, a, results, strict=True)
        )
        expected[name] = value - tau_eff * step
    fednova = run(tmp_path / "b", {"name": "fednova"}, federation=federation)
    torch.testing.assert_close(flat(fednova.global_state), flat(expected), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(flat(fednova.global_state), flat(fedavg.global_state), atol=1e-4)


# --- SCAFFOLD -----------------------------------------------------------------------------


def scaffold_rounds(folder: Path, federation: dict):
    """Yield (setup, state) after each round of a SCAFFOLD run."""
    engine = Engine.from_spec(make_spec({"name": "scaffold"}, federation=federation), folder)
    state = engine.initial_state()
    for rnd in range(federation["rounds"]):
        engine.run_round(rnd, state)
        yield engine.setup, state


def weighted_controls(setup: TrainSetup, state: RunState) -> dict[str, torch.Tensor]:
    """sum_i p_i c_i over all clients (never-sampled clients hold c_i = 0)."""
    p = np.asarray(setup.sizes, dtype=float) / sum(setup.sizes)
    total = {k: torch.zeros_like(v) for k, v in state.server_state.items()}
    for cid, controls in state.client_states.items():
        for name, c_i in controls.items():
            total[name] += float(p[cid]) * c_i
    return total


def test_scaffold_corrections_sum_to_zero_under_full_participation(tmp_path):
    for setup, state in scaffold_rounds(tmp_path, {**FEDERATION, "rounds": 4}):
        c = state.server_state
        assert set(state.client_states) == set(range(5))
        assert any(float(v.abs().max()) > 1e-3 for v in c.values())  # the controls are live
        for name, weighted in weighted_controls(setup, state).items():
            # sum_i p_i (c_i - c) == sum_i p_i c_i - c == 0
            torch.testing.assert_close(
                weighted - c[name], torch.zeros_like(c[name]), atol=1e-6, rtol=0
            )


def test_scaffold_server_control_is_the_weighted_client_mean_under_sampling(tmp_path):
    federation = {**FEDERATION, "rounds": 4, "clients_per_round": 2}
    for setup, state in scaffold_rounds(tmp_path, federation):
        for name, weighted in weighted_controls(setup, state).items():
            torch.testing.assert_close(state.server_state[name], weighted, atol=1e-6, rtol=0)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_scaffold_client_control_is_the_clients_gradient(tmp_path, momentum):
    """With full-batch local steps and a tiny lr the gradient barely moves, so c_i must be the
    client's gradient at the global model, with or without momentum (momentum multiplies the
    displacement by ~4 here: dividing by the step count alone would be 4x off)."""
    sections = {
        "partition": {"scheme": "classes", "clients": 3, "classes_per_client": 4},
        "model": {"arch": "mlp", "hidden": []},
        "federation": {
            "rounds": 1,
            "batch_size": 1000,
            "lr": 1e-5,
            "local_steps": 10,
            "momentum": momentum,
        },
    }
    engine = Engine.from_spec(make_spec({"name": "scaffold"}, **sections), tmp_path)
    setup, state = engine.setup, engine.initial_state()
    start = {k: v.clone() for k, v in state.global_state.items()}
    engine.run_round(0, state)
    for client in setup.clients:
        engine.model.load_state_dict(start)
        engine.model.zero_grad()
        F.cross_entropy(engine.model(client.x), client.y).backward()
        for name, param in engine.model.named_parameters():
            error = state.client_states[client.id][name] - param.grad
            assert float(error.norm() / param.grad.norm()) < 0.01, (client.id, name)


ONE_CLIENT_TWO_STEPS = {
    "partition": {"scheme": "iid", "clients": 1},
    "model": {"arch": "mlp", "hidden": []},
    "federation": {"rounds": 1, "batch_size": 2000, "lr": 1e-5, "local_steps": 2, "momentum": 0.9},
}


@pytest.mark.parametrize(
    ("correction", "steps_of_correction"),
    [("gradient", 1 + 1.9), ("after_step", 2.0)],  # momentum 0.9 amplifies only the first
)
def test_scaffold_correction_forms_under_momentum(tmp_path, correction, steps_of_correction):
    """Two full-batch steps at a tiny lr (the gradient stays put) from a server control c = 0.5:
    the gradient form moves the parameters by lr (1 + 1.9)(c - c_i) more than FedAvg (momentum
    carries the first correction into the second step), the authors' after-step form by 2 lr."""
    final = {}
    algorithms = {"fedavg": {}, "scaffold": {"correction": correction}}
    for name, options in algorithms.items():
        spec = make_spec({"name": name, **options}, **ONE_CLIENT_TWO_STEPS)
        engine = Engine.from_spec(spec, tmp_path / name)
        state = engine.initial_state()
        for value in state.server_state.values():
            value.fill_(0.5)
        engine.run_round(0, state)
        final[name] = flat(state.global_state)
    shift = final["fedavg"] - final["scaffold"]
    expected = torch.full_like(shift, 1e-5 * steps_of_correction * 0.5)
    assert float((shift - expected).abs().max() / expected[0]) < 1e-3


def test_scaffold_after_step_estimates_c_i_over_k_lr_as_the_authors(tmp_path):
    """The authors' c_i+ = c_i - c + (x - y_i) / (K lr): under momentum it is the gradient times
    the momentum's displacement factor a / K (fedhet's default form divides by a instead)."""
    spec = make_spec({"name": "scaffold", "correction": "after_step"}, **ONE_CLIENT_TWO_STEPS)
    engine = Engine.from_spec(spec, tmp_path)
    setup, state = engine.setup, engine.initial_state()
    start = {k: v.clone() for k, v in state.global_state.items()}
    engine.run_round(0, state)
    engine.model.load_state_dict(start)
    engine.model.zero_grad()
    client = setup.clients[0]
    F.cross_entropy(engine.model(client.x), client.y).backward()
    factor = effective_steps(2, 0.9) / 2
    for name, param in engine.model.named_parameters():
        error = state.client_states[0][name] - factor * param.grad
        assert float(error.norm() / param.grad.norm()) < 0.01, name  # float32 displacement


def test_scaffold_beats_fedavg_on_convex_one_class_per_client(tmp_path):
    """Multinomial logistic regression, each client one class, no momentum: client drift
    stalls FedAvg; SCAFFOLD's corrections remove it (Karimireddy et al., 2020)."""
    sections = {
        "partition": {"scheme": "classes", "clients": 10, "classes_per_client": 1},
        "model": {"arch": "mlp", "hidden": []},
        "federation": {"rounds": 8, "batch_size": 32, "lr": 0.05, "local_steps": 10},
        "eval": {"every": 100},
    }
    losses = {}
    for name in ("fedavg", "scaffold"):
        engine = Engine.from_spec(make_spec({"name": name}, **sections), tmp_path / name)
        engine.model.load_state_dict(engine.run().global_state)
        losses[name] = evaluate(engine.model, DIGITS.train_x, DIGITS.train_y)[1]
    assert losses["scaffold"] < 0.75 * losses["fedavg"], losses


def test_an_algorithm_revision_changes_only_its_own_keys(monkeypatch):
    from fedhet.engine.train_plan import train_node
    from fedhet.methods.scaffold.config import ScaffoldConfig

    def key(name: str) -> str:
        return train_node(make_spec({"name": name})).key

    before = {name: key(name) for name in ("fedavg", "scaffold")}
    monkeypatch.setattr(ScaffoldConfig, "revision", ScaffoldConfig.revision + 1)
    assert key("scaffold") != before["scaffold"] and key("fedavg") == before["fedavg"]


def test_an_interrupt_held_until_a_save_ends_keeps_the_round_it_saved(tmp_path, monkeypatch):
    """Ctrl-C during a checkpoint's write is raised as the write ends (interrupts.deferred): the
    round just saved is kept and the message names the next round. The run had kept the state
    before that round, dropped the saved checkpoint and said "round 1" (a flaky CLI test)."""
    save, signalled = Checkpoints.save, []

    def save_then_interrupted(self, state):
        save(self, state)
        if not signalled:  # one Ctrl-C
            signalled.append(state.round)
            raise Interrupted(signal.SIGINT)

    monkeypatch.setattr(Checkpoints, "save", save_then_interrupted)
    runtime = {"progress": False, "checkpoint_every": 1}
    engine = Engine.from_spec(make_spec({"name": "fedavg"}, runtime=runtime), tmp_path)
    with pytest.raises(Interrupted) as stop:
        engine.run()
    assert stop.value.where == f"at round 2 of {FEDERATION['rounds']}"
    assert [p.name for p in tmp_path.glob("ckpt-*.zarr")] == ["ckpt-000001.zarr"]
