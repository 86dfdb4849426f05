"""The personalized methods ditto, pfedme, apfl and perfedavg (issue 48), each by its defining
property:

- Ditto: the global model is FedAvg's bit for bit; lambda = 0 makes each personal model the one
  `local` trains, bit for bit; lambda -> infinity (personal_lr = 1 / lambda) pulls it onto the
  round's global model; the personal update is SGD on CE + lambda/2 ||v - w||^2, by hand.
- pFedMe: beta = 1 is the plain average of the local w's, beta = 2 the paper's mixing; theta and
  the local w are the K-step inner solver and the outer step, by hand; each client is evaluated
  with its theta (the global model for one never trained).
- APFL: alpha fixed at 0 is FedAvg (its global model and every evaluation); the alpha gradient
  is <v - w, grad L(mix)> in closed form on a linear model; learned alphas stay in [0, 1].
- Per-FedAvg: the adapted model is one SGD step of the global one; fo and hf directions on a
  quadratic loss are their closed forms; a client's round is those steps on its schedule.
- A resumed run equals a straight one (Ditto, APFL); each trains on digits through the CLI with
  `eval.client_test`; `fedhet spec validate` accepts each name and refuses a bad field.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import write_spec
from torch import nn

from fedhet.core.rng import torch_generator
from fedhet.core.sealed import arrays
from fedhet.core.spec import Spec, load_spec, parse_spec
from fedhet.core.store import ArtifactStore
from fedhet.engine import tensors
from fedhet.engine.local import batch_schedule
from fedhet.engine.loop import Engine, evaluate
from fedhet.execution.planning import runs_of
from fedhet.methods.apfl.algorithm import mixture_loss
from fedhet.methods.ditto.algorithm import PERSONAL
from fedhet.methods.perfedavg.algorithm import meta_gradient
from fedhet.methods.pfedme.algorithm import THETA

torch.set_num_threads(1)
SPEC = {
    "name": "pfl-digits",
    "seed": 4,
    "data": {"dataset": "digits"},
    "partition": {"scheme": "classes", "clients": 4, "classes_per_client": 3},
    "model": {"arch": "mlp", "hidden": [16]},
    "federation": {"rounds": 2, "batch_size": 16, "lr": 0.05, "local_steps": 3},
    "runtime": {"threads": 1, "progress": False, "device": "cpu"},
}


def spec_of(algorithm: dict, **federation) -> Spec:
    return parse_spec(
        SPEC | {"algorithm": algorithm, "federation": SPEC["federation"] | federation}
    )


def run(tmp_path, algorithm: dict, **federation):
    """A run trained in memory; its clients one at a time (FedAvg's too, for equality)."""
    spec = spec_of(algorithm, **federation)
    spec = spec.model_copy(
        update={"runtime": spec.runtime.model_copy(update={"clients": "sequential"})}
    )
    engine = Engine.from_spec(spec, tmp_path / algorithm["name"])
    return engine, engine.run()


def own(state: dict, prefix: str) -> dict[int, dict]:
    """Each client's model kept under `prefix` in its client state."""
    return {
        c: {n[len(prefix) :]: v for n, v in s.items() if n.startswith(prefix)}
        for c, s in state.client_states.items()
    }


def equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def client_batches(spec: Spec, rnd: int, client, steps: int):
    generator = torch_generator(spec.seed, "local", rnd, client.id)
    return [client.rows(idx) for idx in batch_schedule(client.n, 16, steps, generator)]


# --- Ditto -------------------------------------------------------------------------------------


def test_ditto_lambda_0_is_local_training_and_its_global_model_is_fedavgs(tmp_path):
    sampled = {"clients_per_round": 3, "momentum": 0.5}
    _, ditto = run(tmp_path, {"name": "ditto", "lam": 0}, **sampled)
    _, local = run(tmp_path, {"name": "local"}, **sampled)
    _, fedavg = run(tmp_path, {"name": "fedavg"}, **sampled)
    personal = own(ditto, PERSONAL)
    assert personal.keys() == local.client_states.keys() and len(personal) >= 3
    for cid, model in personal.items():
        assert equal(model, local.client_states[cid]), cid
    assert equal(ditto.global_state, fedavg.global_state)
    assert not equal(ditto.global_state, personal[0])


def test_ditto_large_lambda_pulls_each_personal_model_onto_the_rounds_global_model(tmp_path):
    distances = []
    for lam in (1e2, 1e4):
        engine, state = run(
            tmp_path / str(lam), {"name": "ditto", "lam": lam, "personal_lr": 1 / lam}, rounds=1
        )
        initial = engine.algorithm.initial_model  # the round's global model (round 1)
        distances.append(max(tensors.distance(v, initial) for v in own(state, PERSONAL).values()))
        moved = tensors.distance(state.global_state, initial)
    assert distances[1] < distances[0] / 50 and distances[1] < 1e-2 * moved


def test_ditto_personal_update_is_sgd_on_cross_entropy_plus_the_proximal_term(tmp_path):
    lam, lr = 0.5, 0.05
    engine, state = run(tmp_path, {"name": "ditto", "lam": lam}, rounds=1)
    w = engine.algorithm.initial_model
    model = engine.algorithm.build_model()
    for client in engine.setup.clients:
        model.load_state_dict(w)
        for x, y in client_batches(engine.spec, 0, client, 3):
            grads = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
            with torch.no_grad():
                for (name, p), g in zip(model.named_parameters(), grads, strict=True):
                    p -= lr * (g + lam * (p - w[name]))
        kept = own(state, PERSONAL)[client.id]
        for name, value in model.state_dict().items():
            torch.testing.assert_close(kept[name], value, rtol=0, atol=1e-6)


# --- pFedMe ------------------------------------------------------------------------------------


def one_round(tmp_path, algorithm: dict):
    engine = Engine.from_spec(spec_of(algorithm, rounds=1), tmp_path / algorithm["name"])
    state = engine.initial_state()
    jobs = engine.make_jobs(0, state, [0, 1, 2, 3])
    return engine, state, jobs, [engine.train_client(job) for job in jobs]


def test_pfedme_beta_1_is_plain_averaging_and_beta_mixes_with_the_previous_model(tmp_path):
    engine, state, _, results = one_round(tmp_path, {"name": "pfedme", "lam": 15})
    weights = [0.1, 0.2, 0.3, 0.4]
    average = tensors.weighted_average([r.state for r in results], weights)
    plain = engine.algorithm.aggregate(0, state.global_state, {}, results, weights)
    assert equal(plain, average)
    config = engine.spec.algorithm.model_copy(update={"beta": 2.0})
    mixing = type(engine.algorithm)(config, engine.setup)
    mixed = mixing.aggregate(0, state.global_state, {}, results, weights)
    for name, value in average.items():
        torch.testing.assert_close(mixed[name], 2 * value - state.global_state[name])


def test_pfedme_theta_and_local_model_are_the_inner_solver_and_outer_step_by_hand(tmp_path):
    lam, plr, K, lr = 15.0, 0.01, 4, 0.05
    algorithm = {"name": "pfedme", "lam": lam, "personal_lr": plr, "inner_steps": K}
    engine, state, jobs, results = one_round(tmp_path, algorithm)
    theta = engine.algorithm.build_model()
    for job, result in zip(jobs, results, strict=True):
        theta.load_state_dict(state.global_state)
        local = {n: p.detach().clone() for n, p in theta.named_parameters()}
        for x, y in client_batches(engine.spec, 0, job.client, 3):
            for _ in range(K):
                grads = torch.autograd.grad(F.cross_entropy(theta(x), y), list(theta.parameters()))
                with torch.no_grad():
                    for (n, p), g in zip(theta.named_parameters(), grads, strict=True):
                        p -= plr * (g + lam * (p - local[n]))
            with torch.no_grad():
                for n, p in theta.named_parameters():
                    local[n] -= lr * lam * (local[n] - p)
        kept = {n[len(THETA) :]: v for n, v in job.client_state.items()}
        for name, value in theta.state_dict().items():
            torch.testing.assert_close(kept[name], value, rtol=0, atol=1e-6)
            torch.testing.assert_close(
                result.state[name], local.get(name, value), rtol=0, atol=1e-6
            )


def test_pfedme_evaluates_each_client_with_its_theta(tmp_path):
    engine, state = run(tmp_path, {"name": "pfedme", "personal_lr": 0.02}, rounds=1)
    algorithm, test = engine.algorithm, engine.setup.dataset
    thetas = own(state, THETA)
    model = algorithm.build_model()
    accuracies = []
    for cid in sorted(thetas):
        (evaluated,) = algorithm.evaluation_states(
            state.global_state, {cid: state.client_states[cid]}
        )
        assert equal(evaluated, thetas[cid]) and not equal(evaluated, state.global_state)
        model.load_state_dict(thetas[cid])
        accuracies.append(evaluate(model, test.test_x, test.test_y)[0])
    assert state.metrics["test_accuracy"][-1] == pytest.approx(sum(accuracies) / 4, abs=1e-12)
    (never,) = algorithm.evaluation_states(state.global_state, {9: {}})
    assert equal(never, state.global_state)


# --- APFL --------------------------------------------------------------------------------------


def test_apfl_with_alpha_fixed_at_0_is_fedavg(tmp_path):
    sampled = {"clients_per_round": 3, "momentum": 0.5}
    engine, apfl = run(tmp_path, {"name": "apfl", "alpha": 0, "adaptive": False}, **sampled)
    _, fedavg = run(tmp_path, {"name": "fedavg"}, **sampled)
    assert equal(apfl.global_state, fedavg.global_state)
    assert apfl.metrics["test_accuracy"] == fedavg.metrics["test_accuracy"]
    for evaluated in engine.algorithm.evaluation_states(apfl.global_state, apfl.client_states):
        assert equal(evaluated, apfl.global_state)


def test_apfl_alpha_gradient_is_the_closed_form_on_a_linear_model():
    gen = torch.Generator().manual_seed(0)
    local = nn.Linear(5, 3)
    w = {"weight": torch.randn(3, 5, generator=gen), "bias": torch.randn(3, generator=gen)}
    x, y = torch.randn(8, 5, generator=gen), torch.randint(0, 3, (8,), generator=gen)
    alpha = torch.tensor(0.3, requires_grad=True)
    mixture_loss(local, w, alpha, x, y).backward()
    v = {"weight": local.weight.detach(), "bias": local.bias.detach()}
    mix = {n: 0.3 * v[n] + 0.7 * w[n] for n in v}
    residual = (torch.softmax(x @ mix["weight"].T + mix["bias"], 1) - F.one_hot(y, 3)) / len(y)
    grad = {"weight": residual.T @ x, "bias": residual.sum(0)}  # grad L at the mixture
    closed = sum(((v[n] - w[n]) * grad[n]).sum() for n in v)
    torch.testing.assert_close(alpha.grad, closed)
    torch.testing.assert_close(local.weight.grad, 0.3 * grad["weight"])


def test_apfl_learned_alphas_stay_in_0_1_and_are_kept_per_client(tmp_path):
    _, state = run(tmp_path, {"name": "apfl", "alpha": 0.5}, lr=0.5)
    alphas = [float(s["alpha"]) for s in state.client_states.values()]
    assert len(alphas) == 4 and all(0 <= a <= 1 for a in alphas)
    assert 1.0 in alphas and any(0 < a < 1 and a != 0.5 for a in alphas)  # clipped, and learned


# --- Per-FedAvg --------------------------------------------------------------------------------


def test_perfedavg_adapted_model_is_one_sgd_step_of_the_global_one(tmp_path):
    engine, state = run(tmp_path, {"name": "perfedavg", "alpha": 0.03})
    for cid, client in enumerate(engine.setup.clients):
        (adapted,) = engine.algorithm.evaluation_states(state.global_state, {cid: {}})
        model = engine.algorithm.build_model()
        model.load_state_dict(state.global_state)
        generator = torch_generator(engine.spec.seed, "perfedavg-adapt", cid)
        x, y = client.rows(torch.randperm(client.n, generator=generator)[:16])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.03)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        assert equal(adapted, model.state_dict()), cid


def quadratic(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 0.5 * ((model(x).squeeze(1) - y) ** 2).mean()


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_perfedavg_direction_on_a_quadratic_is_the_closed_form(variant):
    gen = torch.Generator().manual_seed(1)
    model = nn.Linear(4, 1, bias=False).double()
    batches = [
        (torch.randn(6, 4, generator=gen).double(), torch.randn(6, generator=gen).double())
        for _ in range(3)
    ]
    alpha, w = 0.1, model.weight.detach().clone().squeeze(0)

    def gradient(batch, at):  # of 0.5 mean (x.w - y)^2: X^T (X w - y) / n
        x, y = batch
        return x.T @ (x @ at - y) / len(y)

    expected = gradient(batches[1], w - alpha * gradient(batches[0], w))
    if variant == "hf":
        x3 = batches[2][0]
        expected = expected - alpha * (x3.T @ x3 / len(x3)) @ expected
    used = batches[: 2 if variant == "fo" else 3]
    (direction,), _ = meta_gradient(model, used, alpha, 1e-3, quadratic)
    torch.testing.assert_close(direction.squeeze(0), expected)
    assert torch.equal(model.weight.squeeze(0), w)  # the parameters are left as they were


def test_perfedavg_round_takes_fo_steps_on_pairs_of_the_clients_batches(tmp_path):
    alpha, lr = 0.02, 0.05
    engine, state, jobs, results = one_round(tmp_path, {"name": "perfedavg", "alpha": alpha})
    model = engine.algorithm.build_model()
    for job, result in zip(jobs, results, strict=True):
        model.load_state_dict(state.global_state)
        batches = client_batches(engine.spec, 0, job.client, 6)
        for first, second in zip(batches[::2], batches[1::2], strict=True):
            start = [p.detach().clone() for p in model.parameters()]
            adapt = torch.autograd.grad(
                F.cross_entropy(model(first[0]), first[1]), list(model.parameters())
            )
            with torch.no_grad():
                for p, g in zip(model.parameters(), adapt, strict=True):
                    p -= alpha * g
            meta = torch.autograd.grad(
                F.cross_entropy(model(second[0]), second[1]), list(model.parameters())
            )
            with torch.no_grad():
                for p, s, g in zip(model.parameters(), start, meta, strict=True):
                    p.copy_(s - lr * g)
        for name, value in model.state_dict().items():
            torch.testing.assert_close(result.state[name], value, rtol=0, atol=1e-6)
        assert result.stats.steps == 3


def test_a_client_never_sampled_is_scored_with_its_model_before_training(tmp_path):
    """Ditto: the initial model; APFL: alpha times it plus (1 - alpha) times the global model
    (pFedMe's and Per-FedAvg's are checked above)."""
    ditto, state = run(tmp_path, {"name": "ditto"}, rounds=1)
    initial = ditto.algorithm.initial_model
    assert equal(ditto.algorithm.evaluation_states(state.global_state, {7: {}})[0], initial)
    apfl, state = run(tmp_path, {"name": "apfl", "alpha": 0.25}, rounds=1)
    (never,) = apfl.algorithm.evaluation_states(state.global_state, {7: {}})
    for name, value in state.global_state.items():
        torch.testing.assert_close(never[name], 0.25 * initial[name] + 0.75 * value)


# --- resume, CLI -------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", [{"name": "ditto", "lam": 0.5}, {"name": "apfl"}])
def test_a_resumed_run_equals_a_straight_one(tmp_path, algorithm):
    spec = spec_of(algorithm, rounds=4, clients_per_round=2)
    straight = Engine.from_spec(spec, tmp_path / "straight").run()
    first = Engine.from_spec(spec, tmp_path / "resumed")
    state = first.initial_state()
    for rnd in range(2):
        first.run_round(rnd, state)
    state.round = 2
    first.checkpoints.save(state)
    resumed = Engine.from_spec(spec, tmp_path / "resumed").run()
    assert equal(straight.global_state, resumed.global_state)
    assert straight.client_states.keys() == resumed.client_states.keys()
    for cid, kept in straight.client_states.items():
        assert equal(kept, resumed.client_states[cid]), cid
    assert straight.metrics["test_accuracy"] == resumed.metrics["test_accuracy"]


def test_more_rounds_extend_a_stored_ditto_run_to_the_run_from_scratch(fedhet, tmp_path):
    raw = SPEC | {
        "algorithm": {"name": "ditto", "lam": 0.5},
        "federation": SPEC["federation"] | {"clients_per_round": 2},
    }
    spec, extended, scratch = write_spec(tmp_path / "d.yaml", raw), tmp_path / "e", tmp_path / "s"
    assert fedhet("train", spec, "--store", extended).rc == 0
    longer = fedhet("train", spec, "federation.rounds=3", "--store", extended)
    assert longer.rc == 0 and "extends" in longer.stderr, longer.stderr
    assert fedhet("train", spec, "federation.rounds=3", "--store", scratch).rc == 0
    (run,) = runs_of(load_spec(spec, overrides=["federation.rounds=3"]))
    ours = ArtifactStore(extended).open("train", run.node.key)
    reference = dict(arrays(ArtifactStore(scratch).open("train", run.node.key)))
    found = dict(arrays(ours))
    assert found.keys() == reference.keys() and "model/clients/ids" in found
    for name, values in reference.items():
        if not name.endswith("wall_time"):
            assert found[name][...].tobytes() == values[...].tobytes(), name


NAMES = ["ditto", "pfedme", "apfl", "perfedavg"]


def test_each_method_trains_on_digits_and_scores_each_client_on_its_own_test_data(fedhet, tmp_path):
    algorithms = [{"name": n} for n in NAMES] + [{"name": "perfedavg", "variant": "hf"}]
    raw = SPEC | {
        "federation": SPEC["federation"] | {"lr": 0.3, "local_steps": 8},
        "matrix": {"algorithm": algorithms},
        "eval": {"client_test": {"per_client": 30}},
    }
    spec, store = write_spec(tmp_path / "pfl.yaml", raw), tmp_path / "store"
    trained = fedhet("train", spec, "--store", store)
    assert trained.rc == 0, trained.stderr
    scored = fedhet("eval", spec, "--json", "--store", store)
    assert scored.rc == 0, scored.stderr
    reports = json.loads(scored.stdout)
    labels = ["Ditto", "pFedMe", "APFL", "Per-FedAvg", "Per-FedAvg (HF)"]
    assert [r["algorithm"] for r in reports] == labels
    for run, report in zip(runs_of(load_spec(spec)), reports, strict=True):
        tested = ArtifactStore(store).open("train", run.node.key)["metrics"]["test_accuracy"]
        # as in training: the clients' own models on their own test splits, weighted mean
        final = 100 * tested[-1]
        assert report["client_test_weighted_mean_pct"] == pytest.approx(final, abs=1e-9)
        own = report["client_test_pct"]
        assert len(own) == 4 and all(0 <= a <= 100 for a in own)
        assert report["client_test_mean_pct"] == pytest.approx(sum(own) / 4)
        # each client holds 3 classes: its own model is far above chance on its own test data
        assert report["client_test_mean_pct"] > 45, report["algorithm"]


def test_spec_validate_accepts_each_name(fedhet, tmp_path):
    each = {"matrix": {"algorithm": [{"name": name} for name in NAMES]}}
    good = write_spec(tmp_path / "good.yaml", SPEC | each)
    validated = fedhet("spec", "validate", good)
    assert validated.rc == 0, validated.stderr


@pytest.mark.parametrize(
    ("algorithm", "says"),
    [
        ({"name": "ditto", "lam": -1}, "algorithm.lam: input should be greater than or equal to 0"),
        ({"name": "pfedme", "inner_steps": 0}, "algorithm.inner_steps: input should be greater"),
        (
            {"name": "apfl", "alpha": 1.5},
            "algorithm.alpha: input should be less than or equal to 1",
        ),
        ({"name": "perfedavg", "variant": "so"}, "algorithm.variant: input should be 'fo' or 'hf'"),
        ({"name": "pfedme", "local_momentum": 0.9}, "federation.momentum: pfedme's steps are"),
    ],
)
def test_spec_validate_refuses_a_bad_field_in_one_line(fedhet, tmp_path, algorithm, says):
    bad = write_spec(tmp_path / "bad.yaml", SPEC | {"algorithm": algorithm})
    refused = fedhet("spec", "validate", bad)
    assert refused.rc == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr
    assert says in lines[0], lines[0]
