"""FedDyn (Acar et al. 2021, Alg. 1) against its definition.

- By hand: the server's h and theta, a client's new gradient state and its regularizer on
  one-number states, and alpha_k = alpha * (mean size) / n_k.
- Step by step: three rounds with partial participation, unequal client sizes, momentum and
  weight decay agree with an independent replay written as the official code states it
  (alemreacar/FedDyn: SGD with weight decay alpha_k + wd, the loss CE + alpha_k <theta, L_k -
  theta_server>, its gradient clipped at norm 10 before the step, L_k += theta_k - theta_server,
  server = uniform mean + mean over ALL clients of L_k): fedhet's g_k = -alpha_k L_k and
  h = -alpha mean_k L_k; with the clip active (norm 0.5) and without one (null).
- The clip: a gradient over the norm is scaled to it and alpha_k theta is added after it; one
  local step from a client whose unclipped gradient exceeds 10 is the closed-form
  theta - lr (clip(grad CE - g_k - alpha_k theta^{t-1}) + (alpha_k + wd) theta).
- alpha -> 0: the clients become FedAvg's clients (the gap shrinks with alpha), but the server
  does not become FedAvg's: h / alpha does not depend on alpha, so one round moves
  (1 + |P|/m) times the uniform mean update and the distance to FedAvg after a few rounds stays.
- The sequential and vectorized executors agree (MLP: stacked matmuls; CNN: vmap), and the
  client step gives a client alone bitwise its row of the cohort.
- Config validation (alpha > 0 and finite), `fedhet spec validate` through the installed CLI,
  a checkpoint resume equal to a straight run, and a short training on digits.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fedhet.core.errors import InputError
from fedhet.core.rng import torch_generator
from fedhet.core.spec import parse_spec
from fedhet.core.store import ArtifactStore
from fedhet.engine import tensors
from fedhet.engine.client_step import OneClient
from fedhet.engine.local import LocalStats, SGDSettings, batch_schedule
from fedhet.engine.loop import Engine
from fedhet.engine.trainer import ClientResult
from fedhet.execution.planning import runs_of
from fedhet.execution.results import execute
from fedhet.methods.feddyn.algorithm import ALPHA, Dynamic

torch.set_num_threads(1)
MLP = {"arch": "mlp", "hidden": [8]}
CNN = {"arch": "simple_cnn", "norm": "none", "channels": [2, 4], "fc_width": 8}


def spec_of(algorithm: dict, **federation) -> dict:
    return {
        "seed": 4,
        "partition": {"scheme": "dirichlet", "clients": 5, "alpha": 0.3},
        "model": MLP,
        "federation": {
            "rounds": 3,
            "clients_per_round": 3,
            "batch_size": 32,
            "lr": 0.1,
            "local_steps": 3,
        }
        | federation,
        "algorithm": algorithm,
        "runtime": {"progress": False, "clients": "sequential"},
    }


def engine_of(spec: dict, folder: Path) -> Engine:
    return Engine.from_spec(parse_spec(spec), folder)


def close(a: dict, b: dict, atol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=atol, msg=name)


# --- by hand ----------------------------------------------------------------------------


def test_the_server_client_and_regularizer_by_hand(tmp_path):
    spec = spec_of({"name": "feddyn", "alpha": 0.5})
    spec["partition"] = {"scheme": "iid", "clients": 4}
    trainer = engine_of(spec, tmp_path).algorithm
    one = lambda v: torch.tensor([float(v)])  # noqa: E731
    # m = 4, alpha = 0.5, theta^{t-1} = 1, h^{t-1} = 0.2; two clients report 2 and 4:
    # h^t = 0.2 - 0.5/4 ((2 - 1) + (4 - 1)) = -0.3; theta^t = (2 + 4)/2 - (-0.3)/0.5 = 3.6
    server = {"w": one(0.2)}
    results = [ClientResult(c, {"w": one(v)}, 100, LocalStats(1, 0.0)) for c, v in ((0, 2), (1, 4))]
    new = trainer.aggregate(0, {"w": one(1)}, server, results, [0.9, 0.1])  # sizes ignored
    torch.testing.assert_close(server["w"], one(-0.3))
    torch.testing.assert_close(new["w"], one(3.6))

    # g_k = 0.3, alpha_k = 0.5, trained from 1 to 2: g_k - alpha_k (2 - 1) = -0.2
    step = Dynamic({"w": one(1)})
    upload, kept = step.finish(
        {"w": one(0.3), ALPHA: torch.tensor(0.5)}, {"w": one(2)}, None, SGDSettings(0.1)
    )
    assert upload == {}
    torch.testing.assert_close(kept["w"], one(-0.2))
    # its regularizer at theta = 3: 0.5/2 (3 - 1)^2 - 0.3 * 3 = 0.1; a second client with
    # g = -1, alpha = 2 at theta = 0: 2/2 (0 - 1)^2 - 0 = 1
    params = {"w": torch.tensor([[3.0], [0.0]])}
    extras = {"w": torch.tensor([[0.3], [-1.0]]), ALPHA: torch.tensor([0.5, 2.0])}
    torch.testing.assert_close(step.client_loss(params, extras), torch.tensor([0.1, 1.0]))
    # and a first-round client: g_k = 0
    assert torch.equal(step.extras({ALPHA: torch.tensor(0.5)})["w"], one(0))


def test_alpha_is_scaled_by_size_as_the_official_code_or_uniform(tmp_path):
    engine = engine_of(spec_of({"name": "feddyn", "alpha": 0.1}), tmp_path / "size")
    sizes, clients = engine.setup.sizes, engine.setup.clients
    mean = sum(sizes) / len(sizes)
    assert len(set(sizes)) > 1
    for c in clients:
        alpha = engine.algorithm.initial_client_state(c)[ALPHA]
        assert float(alpha) == pytest.approx(0.1 * mean / c.n, rel=1e-6)
    uniform = {"name": "feddyn", "alpha": 0.1, "alpha_per_client": "uniform"}
    engine = engine_of(spec_of(uniform), tmp_path / "uniform")
    for c in clients:
        assert float(engine.algorithm.initial_client_state(c)[ALPHA]) == pytest.approx(0.1)


# --- step by step against the official code's form -----------------------------------------


def official_client(engine, theta, local, alpha_k, cid, rnd, clip=10.0):
    """theta_k: the official `train_feddyn_mdl` with fedhet's batches (clip None: none)."""
    fed, client = engine.spec.federation, engine.setup.clients[cid]
    model = engine.algorithm.build_model()
    model.load_state_dict(theta)
    decay = alpha_k + fed.weight_decay
    opt = torch.optim.SGD(model.parameters(), lr=fed.lr, momentum=fed.momentum, weight_decay=decay)
    generator = torch_generator(engine.spec.seed, "local", rnd, cid)
    for idx in batch_schedule(client.n, fed.batch_size, fed.local_steps, generator):
        opt.zero_grad()
        loss = F.cross_entropy(model(client.x[idx]), client.y[idx])
        for name, p in model.named_parameters():
            loss = loss + alpha_k * (p * (local[name] - theta[name])).sum()
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=clip)
        opt.step()
    return {n: v.detach().clone() for n, v in model.state_dict().items()}


@pytest.mark.parametrize("clip", [10.0, 0.5, None])
def test_three_rounds_match_the_official_code_step_by_step(tmp_path, clip):
    alpha = 0.1
    algorithm = {"name": "feddyn", "alpha": alpha, "clip_norm": clip}
    spec = spec_of(algorithm, momentum=0.5, weight_decay=1e-3)
    engine = engine_of(spec, tmp_path)
    state = engine.initial_state()
    names = sorted(engine.algorithm.param_names)
    holders, sizes = engine.holders, engine.setup.sizes
    mean_n = sum(sizes[c] for c in holders) / len(holders)
    alphas = {c: alpha / (sizes[c] / mean_n) for c in holders}
    assert len(holders) == 5 and max(alphas.values()) > 1.5 * min(alphas.values())
    theta = tensors.clone(state.global_state)
    local = {c: {n: torch.zeros_like(theta[n]) for n in names} for c in holders}  # L_k
    rounds = [engine.plan(rnd).reported for rnd in range(3)]
    # a client trains twice (its g_k carried over), and one never trains yet counts in m = 5
    assert any(sum(c in r for r in rounds) > 1 for c in holders)
    assert any(all(c not in r for r in rounds) for c in holders)
    for rnd, sampled in enumerate(rounds):
        models = []
        for cid in sampled:
            theta_k = official_client(engine, theta, local[cid], alphas[cid], cid, rnd, clip)
            for n in names:
                local[cid][n] += theta_k[n] - theta[n]
            models.append(theta_k)
        average = tensors.weighted_average(models, [1 / len(models)] * len(models))
        theta = {
            n: v + sum(local[c][n] for c in holders) / len(holders) if n in names else v
            for n, v in average.items()
        }
        engine.run_round(rnd, state)
        close(state.global_state, theta)
        h = {n: -alpha * sum(local[c][n] for c in holders) / len(holders) for n in names}
        close(state.server_state, h, atol=1e-6)
        for cid in sampled:
            own = state.client_states[cid]
            g = {n: -alphas[cid] * local[cid][n] for n in names}
            close({n: own[n] for n in names}, g, atol=1e-6)
            assert float(own[ALPHA]) == pytest.approx(alphas[cid], rel=1e-6)
    assert max(float(v.abs().max()) for v in state.server_state.values()) > 1e-3  # h is live


# --- the official code's clip -------------------------------------------------------------


def test_the_clip_bounds_the_data_and_linear_gradient_and_leaves_the_decay_out(tmp_path):
    step = Dynamic({"w": torch.zeros(2, 3)}, clip_norm=10.0)
    generator = torch.Generator().manual_seed(3)
    grads = {"w": torch.randn(2, 2, 3, generator=generator)}
    grads["w"][0] *= 50 / grads["w"][0].norm()  # client 0 over the norm, client 1 under
    grads["w"][1] *= 3 / grads["w"][1].norm()
    params = {"w": torch.randn(2, 2, 3, generator=generator)}
    alpha = torch.tensor([0.5, 2.0])
    corrected = step.correct(grads, {ALPHA: alpha}, params)["w"]
    clipped = corrected - alpha.view(2, 1, 1) * params["w"]  # the part the clip saw
    assert float(clipped[0].norm()) == pytest.approx(10.0, rel=1e-5)
    torch.testing.assert_close(clipped[0], grads["w"][0] * 10 / 50, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(clipped[1], grads["w"][1])  # under the norm: as it was
    unclipped = Dynamic(step.anchor, clip_norm=None).correct(grads, {ALPHA: alpha}, params)
    torch.testing.assert_close(unclipped["w"] - alpha.view(2, 1, 1) * params["w"], grads["w"])


@pytest.mark.parametrize("clip", [10.0, None])
def test_one_step_is_the_closed_form_clipped_update(tmp_path, clip):
    algorithm = {"name": "feddyn", "alpha": 0.3, "clip_norm": clip}
    spec = spec_of(algorithm, local_steps=1, momentum=0.9, weight_decay=1e-3)
    engine = engine_of(spec, tmp_path)
    state = engine.initial_state()
    theta = state.global_state
    [job] = engine.make_jobs(0, state, [2])
    alpha_k = float(job.client_state[ALPHA])
    g_k = {n: torch.full_like(theta[n], 0.5) for n in engine.algorithm.param_names}
    job.client_state.update(g_k)  # a live gradient state far over the norm
    idx = next(engine.algorithm.client_batches(engine.make_jobs(0, state, [2])[0]))
    result = engine.train_client(job)
    # by hand: the gradient of CE - <g_k + alpha_k theta^{t-1}, theta>, at theta = theta^{t-1}
    model = engine.algorithm.build_model()
    model.load_state_dict(theta)
    params = dict(model.named_parameters())
    loss = F.cross_entropy(model(job.client.x[idx]), job.client.y[idx])
    loss = loss - sum((p * (g_k[n] + alpha_k * theta[n])).sum() for n, p in params.items())
    grads = dict(zip(params, torch.autograd.grad(loss, list(params.values())), strict=True))
    norm = float(torch.cat([g.flatten() for g in grads.values()]).norm())
    assert norm > 10  # the unclipped step would exceed the norm
    scale = 1.0 if clip is None else clip / (norm + 1e-6)
    lr, decay = spec["federation"]["lr"], alpha_k + 1e-3
    for name in params:
        expected = theta[name] - lr * (scale * grads[name] + decay * theta[name])
        torch.testing.assert_close(result.state[name], expected, rtol=1e-5, atol=1e-6)


# --- alpha -> 0 -----------------------------------------------------------------------------


def client_gap(alpha: float, folder: Path) -> float:
    """Round 2's client models of FedDyn (live g_k from round 1) against FedAvg's clients from
    the same server model: the largest distance over the round's clients."""
    feddyn = engine_of(spec_of({"name": "feddyn", "alpha": alpha}), folder / "dyn")
    fedavg = engine_of(spec_of({"name": "fedavg"}), folder / "avg")
    state = feddyn.initial_state()
    feddyn.run_round(0, state)
    clients = feddyn.plan(1).reported
    dyn = [feddyn.train_client(j) for j in feddyn.make_jobs(1, state, clients)]
    avg = [fedavg.train_client(j) for j in fedavg.make_jobs(1, state, clients)]
    return max(tensors.distance(d.state, a.state) for d, a in zip(dyn, avg, strict=True))


def test_as_alpha_goes_to_zero_the_clients_become_fedavg_clients(tmp_path):
    gaps = [client_gap(a, tmp_path / str(a)) for a in (1e-1, 1e-2, 1e-4, 1e-7)]
    assert gaps[0] > 1e-3 and gaps[0] > gaps[1] > gaps[2] > gaps[3]
    assert gaps[2] < 5e-3 * gaps[0]  # about linear in alpha
    assert gaps[3] < 1e-5


def test_as_alpha_goes_to_zero_the_server_does_not_become_fedavg(tmp_path):
    """theta^1 = theta^0 + (1 + |P|/m) (uniform mean of FedAvg's client models - theta^0) in the
    limit; after three rounds FedDyn's distance to FedAvg does not shrink with alpha."""
    base = spec_of({"name": "fedavg"})
    base["partition"] = {"scheme": "iid", "clients": 4}  # m = 4, |P| = 3
    fedavg = engine_of(base, tmp_path / "avg")
    start = fedavg.initial_state()
    clients = fedavg.plan(0).reported
    models = [fedavg.train_client(j).state for j in fedavg.make_jobs(0, start, clients)]
    mean = tensors.weighted_average(models, [1 / 3] * 3)
    limit = {n: v + (1 + 3 / 4) * (mean[n] - v) for n, v in start.global_state.items()}
    feddyn = engine_of(base | {"algorithm": {"name": "feddyn", "alpha": 1e-7}}, tmp_path / "dyn")
    state = feddyn.initial_state()
    feddyn.run_round(0, state)
    close(state.global_state, limit)

    reference = fedavg.run().global_state
    far = {}
    for alpha in (1e-1, 1e-4, 1e-7):
        spec = base | {"algorithm": {"name": "feddyn", "alpha": alpha}}
        final = engine_of(spec, tmp_path / f"dyn{alpha}").run().global_state
        far[alpha] = tensors.distance(final, reference)
    moved = tensors.distance(reference, start.global_state)
    assert far[1e-7] > 0.5 * moved  # far from FedAvg, on FedAvg's own scale
    assert far[1e-7] == pytest.approx(far[1e-4], rel=0.01)  # and it stays as alpha -> 0


# --- executors ------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_sequential_and_vectorized_executors_agree(tmp_path, model):
    final = {}
    for clients in ("sequential", "vectorized"):
        spec = spec_of({"name": "feddyn", "alpha": 0.1}, momentum=0.5, batch_size=16)
        spec["model"] = MLP if model == "mlp" else CNN
        spec["runtime"] = {"progress": False, "clients": clients}
        engine = engine_of(spec, tmp_path / clients)
        final[clients] = engine.run()
        assert getattr(engine.executor, "ran", {"sequential"}) == {clients}
    seq, vec = final["sequential"], final["vectorized"]
    close(seq.global_state, vec.global_state)
    close(seq.server_state, vec.server_state, atol=1e-6)
    assert seq.client_states.keys() == vec.client_states.keys()
    for cid, own in seq.client_states.items():
        close(own, vec.client_states[cid], atol=1e-6)
    assert seq.metrics["train_loss"] == pytest.approx(vec.metrics["train_loss"], rel=1e-5)


def test_a_client_alone_gets_bitwise_its_row_of_the_cohort(tmp_path):
    trainer = engine_of(spec_of({"name": "feddyn"}), tmp_path).algorithm
    generator = torch.Generator().manual_seed(0)
    models = [trainer.build_model() for _ in range(3)]
    params = {n: p.detach() for n, p in models[0].named_parameters()}
    noisy = lambda: {n: 0.05 * torch.randn(v.shape, generator=generator) for n, v in params.items()}  # noqa: E731
    step = trainer.client_step(0, {n: v + 0.05 for n, v in params.items()}, {})
    extras = [step.extras(noisy() | {ALPHA: torch.tensor(a)}) for a in (0.1, 0.5, 2.0)]
    stacked = {n: torch.stack([e[n] for e in extras]) for n in extras[0]}
    rows = [dict(m.named_parameters()) for m in models]
    cohort = {n: torch.stack([r[n].detach() for r in rows]).requires_grad_() for n in params}
    term = step.client_loss(cohort, stacked)
    term.sum().backward()
    for i, model in enumerate(models):
        alone = OneClient(step, model, extras[i], 0.1).loss(torch.zeros(()))
        alone.backward()
        assert torch.equal(alone, term[i])
        for n, p in model.named_parameters():
            assert torch.equal(p.grad, cohort[n].grad[i])
    assert len(set(term.tolist())) == 3


# --- config, CLI, resume, training ----------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("alpha", 0, "algorithm.alpha: input should be greater than 0"),
        ("alpha", -0.1, "algorithm.alpha: input should be greater than 0"),
        ("alpha", float("nan"), "algorithm.alpha: input should be a finite number"),
        ("alpha", float("inf"), "algorithm.alpha: input should be a finite number"),
        ("alpha_per_client", "all", "algorithm.alpha_per_client: input should be 'size' or"),
        ("clip_norm", 0, "algorithm.clip_norm: input should be greater than 0"),
        ("clip_norm", float("inf"), "algorithm.clip_norm: input should be a finite number"),
    ],
)
def test_bad_config_is_refused_naming_the_field(field, value, says):
    with pytest.raises(InputError, match=says.replace("(", r"\(")):
        parse_spec({"algorithm": {"name": "feddyn", field: value}})
    config = parse_spec({"algorithm": {"name": "feddyn"}}).algorithm
    assert config.alpha == 0.01 and config.alpha_per_client == "size"
    assert config.clip_norm == 10.0  # the official code's
    assert config.model_dump() == {"name": "feddyn", "alpha": 0.01}  # the options stay out
    unclipped = parse_spec({"algorithm": {"name": "feddyn", "clip_norm": None}}).algorithm
    assert unclipped.model_dump() == {"name": "feddyn", "alpha": 0.01, "clip_norm": None}


def test_spec_validate_through_the_installed_cli(tmp_path):
    fedhet = Path(sys.executable).parent / "fedhet"
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("name: good\nalgorithm: {name: feddyn, alpha: 0.1}\n")
    bad.write_text("name: bad\nalgorithm: {name: feddyn, alpha: 0}\n")
    ok = subprocess.run([fedhet, "spec", "validate", good], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    refused = subprocess.run([fedhet, "spec", "validate", bad], capture_output=True, text=True)
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr
    assert "algorithm.alpha: input should be greater than 0" in lines[0]


def test_a_resumed_run_equals_a_straight_one(tmp_path):
    spec = spec_of({"name": "feddyn", "alpha": 0.1}, rounds=4)
    straight = engine_of(spec, tmp_path / "straight").run()
    first = engine_of(spec, tmp_path / "resumed")
    state = first.initial_state()
    for rnd in range(2):
        first.run_round(rnd, state)
    state.round = 2
    first.checkpoints.save(state)
    resumed = engine_of(spec, tmp_path / "resumed").run()
    for a, b in (
        (straight.global_state, resumed.global_state),
        (straight.server_state, resumed.server_state),
    ):
        assert all(torch.equal(a[n], b[n]) for n in a)
    for cid, own in straight.client_states.items():
        assert all(torch.equal(own[n], resumed.client_states[cid][n]) for n in own)


def test_a_short_training_on_digits(tmp_path):
    spec = spec_of({"name": "feddyn", "alpha": 0.01}, rounds=8, local_steps=10, lr=0.05)
    spec |= {"name": "feddyn_digits", "data": {"dataset": "digits"}, "eval": {"every": 4}}
    spec["model"] = {"arch": "mlp", "hidden": [32]}
    spec["runtime"] = {"threads": 1, "progress": False, "device": "cpu"}
    (run,) = runs_of(parse_spec(spec))
    group = execute(run, ArtifactStore(tmp_path))
    accuracy = group["metrics"]["test_accuracy"][:]
    assert accuracy[-1] > 0.6, accuracy
    assert group.attrs["summary"]["final"] == pytest.approx(accuracy[-1])
