"""Mixup (FedAvg + Mixup), FedMix and FedBR + Mixup (issue 34): the mixed batch as defined, the
alpha -> 0 limit equal to FedAvg (and to FedBR) to the bit, FedMix's shared means as group means
of each client's own data, its loss equal to its formula, its one-off traffic, the fedbr option
leaving every existing key alone, the configs' validation, and a short training of each."""

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
from fedhet.core.spec import load_spec, parse_spec
from fedhet.core.store import ArtifactStore
from fedhet.engine.loop import Engine
from fedhet.engine.mixup import Mixer, Mixup
from fedhet.engine.setup import build_setup
from fedhet.execution.planning import runs_of
from fedhet.execution.results import execute, stored_metrics
from fedhet.methods.fedmix.algorithm import FedMix, fedmix_loss, group_means

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]
BASE = {
    "seed": 5,
    "data": {"dataset": "digits"},
    "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.5},
    "model": {"arch": "mlp", "hidden": [16]},
    "federation": {"rounds": 2, "batch_size": 16, "lr": 0.05, "local_steps": 4},
    "algorithm": {"name": "mixup"},
    "runtime": {"threads": 1, "progress": False, "device": "cpu", "clients": "sequential"},
}
FEDBR = {"name": "fedbr", "projection_width": 8, "projection_dim": 4, "pseudo": {"size": 8}}


def make_spec(algorithm: dict, **sections) -> object:
    return parse_spec(spec_data(BASE, algorithm, **sections))


def train(spec, tmp_path: Path):
    """The run of `spec` through the pipeline (its upstream stages too): (metrics, final state)."""
    (run,) = runs_of(spec)
    store = ArtifactStore(tmp_path / "store")
    artifact = execute(run, store)
    return stored_metrics(artifact), artifact


def engine_run(spec, folder: Path):
    return Engine.from_spec(spec, folder).run()


# --- the mixup helper ----------------------------------------------------------------------


def test_a_mixed_batch_is_lambda_x_i_plus_one_minus_lambda_x_j_with_labels_alike():
    x = torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.5, 4.0], [-2.0, 0.0]])
    y = torch.tensor([0, 1, 1, 2])
    mix = Mixup(0.75, torch.tensor([2, 0, 3, 1]))
    expected_x = torch.tensor(
        [
            [0.75 * 1.0 + 0.25 * 0.5, 0.75 * 2.0 + 0.25 * 4.0],
            [0.75 * 3.0 + 0.25 * 1.0, 0.75 * -1.0 + 0.25 * 2.0],
            [0.75 * 0.5 + 0.25 * -2.0, 0.75 * 4.0 + 0.25 * 0.0],
            [0.75 * -2.0 + 0.25 * 3.0, 0.75 * 0.0 + 0.25 * -1.0],
        ]
    )
    assert torch.equal(mix.inputs(x), expected_x)
    expected_y = torch.tensor(
        [[0.75, 0.25, 0.0], [0.25, 0.75, 0.0], [0.0, 0.75, 0.25], [0.0, 0.25, 0.75]]
    )
    assert torch.equal(mix.labels(y, 3), expected_y)
    logits = torch.tensor([[0.3, -1.0, 2.0], [1.0, 0.0, 0.5], [-0.2, 0.7, 0.1], [2.0, 1.0, 0.0]])
    soft_ce = -(expected_y * torch.log_softmax(logits, 1)).sum(1).mean()
    torch.testing.assert_close(mix.loss(logits, y), soft_ce)


def test_the_mixer_draws_folded_beta_lambdas_and_permutations_from_its_seed():
    draws = [Mixer(1.0, 7).draw(6) for _ in range(2)]
    assert draws[0].lam == draws[1].lam and torch.equal(draws[0].partner, draws[1].partner)
    mixer = Mixer(1.0, 8)
    many = [mixer.draw(6) for _ in range(3000)]
    assert all(sorted(m.partner.tolist()) == list(range(6)) for m in many)
    lams = torch.tensor([m.lam for m in many])
    assert lams.min() >= 0.5 and lams.max() <= 1.0
    # Beta(1, 1) is uniform: E max(U, 1 - U) = 3/4, standard error 0.0026
    assert abs(lams.mean().item() - 0.75) < 0.015
    assert all(Mixer(1e-9, s).draw(4).lam == 1.0 for s in range(50))  # alpha -> 0
    with pytest.raises(ValueError, match="alpha"):
        Mixer(0.0, 1)


def test_mixup_with_alpha_to_zero_is_fedavg_to_the_bit(tmp_path):
    fedavg = engine_run(make_spec({"name": "fedavg"}), tmp_path / "fedavg")
    limit = engine_run(make_spec({"name": "mixup", "alpha": 1e-9}), tmp_path / "limit")
    mixed = engine_run(make_spec({"name": "mixup", "alpha": 0.2}), tmp_path / "mixed")
    for name, value in fedavg.global_state.items():
        assert torch.equal(limit.global_state[name], value), name
    assert limit.metrics["train_loss"] == fedavg.metrics["train_loss"]
    assert not all(torch.equal(mixed.global_state[n], v) for n, v in fedavg.global_state.items())


def test_fedbr_with_mixup_to_zero_is_fedbr_to_the_bit(tmp_path):
    plain, _ = train(make_spec(FEDBR), tmp_path)
    limit, _ = train(make_spec({**FEDBR, "mixup": 1e-9}), tmp_path)
    mixed, _ = train(make_spec({**FEDBR, "mixup": 0.2}), tmp_path)
    assert limit["train_loss"] == plain["train_loss"]
    assert limit["test_loss"] == plain["test_loss"]
    assert mixed["train_loss"] != plain["train_loss"]


def test_fedbr_with_mixup_off_keeps_every_key():
    golden = json.loads((REPO / "tests" / "golden" / "keys.json").read_text())
    for name in ("fedbr_fmnist.yaml", "fedbr_fmnist_skew.yaml"):
        spec = load_spec(REPO / "specs" / name)
        for number, run in enumerate(runs_of(spec)):
            keys = {f"{n.stage}#{i}": n.key for i, n in enumerate(run.node.walk())}
            assert keys == golden[name][number], (name, number)
    off = make_spec(FEDBR)
    assert "mixup" not in off.algorithm.model_dump()
    explicit = make_spec({**FEDBR, "mixup": None})
    assert explicit.algorithm.plan(explicit).key == off.algorithm.plan(off).key
    on = make_spec({**FEDBR, "mixup": 0.2})
    assert on.algorithm.plan(on).key != off.algorithm.plan(off).key
    assert on.algorithm.label() == "FedBR (mixup)" and off.algorithm.label() == "FedBR"


# --- FedMix --------------------------------------------------------------------------------


def test_fedmix_means_are_the_means_of_disjoint_groups_of_the_clients_own_samples():
    # integer images and M = 4: every sum and mean below is exact in float32
    x = torch.arange(9 * 2 * 2, dtype=torch.float32).view(9, 1, 2, 2) ** 2 % 23
    y = torch.tensor([0, 1, 2, 0, 0, 1, 2, 2, 1])
    means = group_means(x, y, 3, 4, torch.Generator().manual_seed(0))
    members = means.members.tolist()
    assert len(members) == 2 and all(len(g) == 4 for g in members)  # 9 // 4 groups, 1 left out
    flat = [i for g in members for i in g]
    assert len(set(flat)) == 8 and set(flat) <= set(range(9))
    for g, group in enumerate(members):
        total = x[group[0]] + x[group[1]] + x[group[2]] + x[group[3]]
        assert torch.equal(means.x[g], total / 4)
        counts = [sum(1 for i in group if y[i] == c) for c in range(3)]
        assert means.y[g].tolist() == [c / 4 for c in counts]
    whole = group_means(x, y, 3, 9, torch.Generator().manual_seed(1))  # M = n: one mean
    torch.testing.assert_close(whole.x[0], x.mean(0))
    assert whole.y[0].tolist() == pytest.approx([3 / 9, 3 / 9, 3 / 9])
    assert len(group_means(x, y, 3, 10, torch.Generator()).y) == 0  # fewer than M: none


def test_a_fedmix_client_draws_only_the_other_clients_means_of_their_own_data():
    spec = make_spec({"name": "fedmix", "mean_size": 5})
    setup = build_setup(spec)
    algo = FedMix(spec.algorithm, setup)
    for cid, means in algo.means.items():
        client = setup.clients[cid]
        assert len(means.y) == client.n // 5
        for g in range(len(means.y)):
            group = means.members[g]
            torch.testing.assert_close(means.x[g], client.x[group].mean(0))
            counts = torch.bincount(client.y[group], minlength=10).float() / 5
            assert torch.equal(means.y[g], counts)
    own = algo.means[0].x.flatten(1)
    others = torch.cat([m.x for cid, m in algo.means.items() if cid != 0]).flatten(1)
    x_bar, y_bar = algo.pool.draw(algo.sources(0), 200, torch.Generator().manual_seed(3))
    assert x_bar.shape == (200, *setup.dataset.shape) and y_bar.shape == (200, 10)
    for row in x_bar.flatten(1):
        assert (others == row).all(1).any() and not (own == row).all(1).any()


def test_a_client_that_receives_no_mean_is_refused_in_one_line():
    spec = make_spec({"name": "fedmix", "mean_size": 100000})
    algo = FedMix(spec.algorithm, build_setup(spec))
    with pytest.raises(Exception, match="lower it") as err:
        algo.sources(0)
    assert "algorithm.mean_size=100000" in str(err.value) and "\n" not in str(err.value)


def per_sample_reference(model, x, y, x_bar, y_bar, lam, derivative):
    """FedMix's loss computed sample by sample, each dl/dx from its own autograd call."""
    terms = []
    for i in range(len(y)):
        z = ((1 - lam) * x[i : i + 1]).clone().requires_grad_()
        logits = model(z)
        first = (1 - lam) * F.cross_entropy(logits, y[i : i + 1])
        second = -lam * (torch.log_softmax(logits, 1)[0] * y_bar[i]).sum()
        (g,) = torch.autograd.grad(first, z, create_graph=True)
        if derivative == "batch_mean":
            g = g / len(y)  # d/dz_i of the batch mean of the first term
        terms.append(first + second + lam * (g[0] * x_bar[i]).sum())
    return torch.stack(terms).mean()


@pytest.mark.parametrize("derivative", ["batch_mean", "sample"])
def test_fedmix_loss_is_its_formula_on_a_hand_built_batch(derivative):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3)
    ).double()
    x = torch.tensor([[1.0, -2.0, 0.5, 3.0], [0.0, 1.0, -1.0, 2.0], [2.0, 2.0, -0.5, 0.0]])
    x = x.double().view(3, 1, 2, 2)
    y = torch.tensor([2, 0, 1])
    x_bar = torch.tensor([[0.5, 0.5, 1.0, -1.0], [1.0, 0.0, 0.0, 1.0], [-1.0, 2.0, 0.5, 0.5]])
    x_bar = x_bar.double().view(3, 1, 2, 2)
    y_bar = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.0, 0.0, 1.0]]).double()
    ours = fedmix_loss(model, x, y, x_bar, y_bar, 0.1, derivative)
    reference = per_sample_reference(model, x, y, x_bar, y_bar, 0.1, derivative)
    torch.testing.assert_close(ours, reference, rtol=1e-12, atol=1e-12)
    # it trains through its Taylor term: the parameters' gradients (second derivatives) agree
    params = list(model.parameters())
    for a, b in zip(
        torch.autograd.grad(ours, params), torch.autograd.grad(reference, params), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    # the Taylor term is there: without x_bar the loss changes
    without = fedmix_loss(model, x, y, torch.zeros_like(x_bar), y_bar, 0.1, derivative)
    assert not torch.isclose(without, ours, rtol=1e-9)


def test_fedmix_exchanges_its_means_once_and_trains(tmp_path):
    spec = make_spec({"name": "fedmix"}, federation={"rounds": 3})
    state = engine_run(spec, tmp_path)
    setup = build_setup(spec)
    metrics = state.metrics
    pixels = math.prod(setup.dataset.shape)
    groups = [setup.clients[c].n // 10 for c in setup.holders]
    up = sum(groups) * (pixels + 10) * 4  # float32 images and class frequencies
    down = sum((sum(groups) - g) * (pixels + 10) * 4 for g in groups)
    # every client trains every round, so the model's traffic is the same in each round
    assert metrics["bytes_up"][0] - metrics["bytes_up"][1] == up
    assert metrics["bytes_down"][0] - metrics["bytes_down"][1] == down
    assert metrics["bytes_up"][1] == metrics["bytes_up"][2]
    assert metrics["comm_rounds"] == [2.0, 1.0, 1.0]
    assert all(math.isfinite(v) for v in metrics["train_loss"] + metrics["test_accuracy"])


# --- configs and the command line ----------------------------------------------------------


@pytest.mark.parametrize(
    ("algorithm", "message"),
    [
        ({"name": "mixup", "alpha": 0}, "algorithm.alpha: input should be greater than 0"),
        ({"name": "mixup", "alpha": -1}, "algorithm.alpha: input should be greater than 0"),
        ({"name": "fedmix", "lam": 0}, "algorithm.lam: input should be greater than 0"),
        ({"name": "fedmix", "lam": 1}, "algorithm.lam: input should be less than 1"),
        ({"name": "fedmix", "mean_size": 0}, "algorithm.mean_size: input should be greater"),
        ({"name": "fedmix", "derivative": "exact"}, "algorithm.derivative: "),
        ({"name": "fedbr", "mixup": 0}, "algorithm.mixup: input should be greater than 0"),
        (
            {"name": "fedbr", "mixup": True},
            "algorithm.mixup: input should be a valid number (got True)",
        ),
        ({"name": "mixup", "vhl": {}}, "algorithm.vhl: applies to algorithm"),
    ],
)
def test_bad_values_are_refused_naming_the_field(algorithm, message):
    data = copy.deepcopy(BASE) | {"algorithm": algorithm}
    with pytest.raises(InputError) as err:
        parse_spec(data)
    assert message in str(err.value)


def test_defaults_are_the_official_codes_and_labels_name_the_rows():
    mixup = make_spec({"name": "mixup"}).algorithm
    fedmix = make_spec({"name": "fedmix"}).algorithm
    assert mixup.alpha == 0.2 and mixup.label() == "FedAvg+Mixup"
    assert (fedmix.lam, fedmix.mean_size, fedmix.derivative) == (0.1, 10, "batch_mean")
    assert fedmix.label() == "FedMix"


def fedhet_cli(*args: str) -> subprocess.CompletedProcess:
    """The installed console script, as a user runs it."""
    script = Path(sys.executable).with_name("fedhet")
    return subprocess.run([script, *args], capture_output=True, text=True, timeout=120)


def test_spec_validate_through_the_installed_cli(tmp_path):
    data = copy.deepcopy(BASE)
    data["matrix"] = {"algorithm": [{"name": "mixup"}, {"name": "fedmix"}, {**FEDBR, "mixup": 0.2}]}
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(data))
    data["matrix"]["algorithm"][1]["lam"] = 1.5
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    ok = fedhet_cli("spec", "validate", str(good))
    assert ok.returncode == 0, ok.stderr
    assert "valid (3 runs)" in ok.stdout
    refused = fedhet_cli("spec", "validate", str(bad))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "algorithm.lam: input should be less than 1" in lines[0]


# --- end to end ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "algorithm",
    [{"name": "mixup"}, {"name": "fedmix"}, {**FEDBR, "mixup": 0.2}],
    ids=["mixup", "fedmix", "fedbr+mixup"],
)
def test_each_trains_on_digits_through_the_pipeline(tmp_path, algorithm):
    spec = make_spec(algorithm, federation={"rounds": 3})
    metrics, _ = train(spec, tmp_path)
    for name in ("train_loss", "test_loss", "test_accuracy", "bytes_up"):
        assert all(math.isfinite(v) for v in metrics[name]), name
    assert 0 <= metrics["test_accuracy"][-1] <= 1
    assert metrics["train_loss"][-1] < metrics["train_loss"][0]
