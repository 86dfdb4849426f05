"""FedImpro: feature statistics (Eq. 7, Eq. 8), class-balanced sampling, the decoupled local
objective, the algorithm in the engine, and Theorem 4.2 measured with the CGV metric."""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_SPEC, write_spec

from fedhet.cli import main
from fedhet.core.spec import ModelSpec, Spec, parse_spec
from fedhet.data.clients import ClientData
from fedhet.data.datasets import load_dataset
from fedhet.data.partition import make_partition
from fedhet.engine import tensors
from fedhet.engine.loop import Engine, sample_clients
from fedhet.engine.setup import build_setup
from fedhet.methods.fedimpro import objective
from fedhet.methods.fedimpro.algorithm import MEAN, VAR, FedImpro, resolve_split
from fedhet.methods.fedimpro.dissimilarity import decoupled_cgv
from fedhet.methods.fedimpro.objective import decoupled_loss, official_loss, parameter_groups
from fedhet.methods.fedimpro.statistics import (
    add_noise,
    aggregate_statistics,
    balanced_labels,
    class_moments,
    sample_features,
    update_statistics,
)
from fedhet.metrics.cgv import client_gradient_variance
from fedhet.models import build_model

torch.set_num_threads(1)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- statistics -------------------------------------------------------------------------


def test_update_matches_a_per_class_moving_average_reference():
    mean, var = torch.rand(3, 4, generator=gen(0)), torch.rand(3, 4, generator=gen(1))
    feats = torch.randn(7, 2, 2, generator=gen(2))  # flattened to 4 dims
    labels = torch.tensor([0, 0, 2, 0, 2, 2, 1])  # class 1 has a single sample
    expected_mean, expected_var = mean.clone(), var.clone()
    flat = feats.reshape(7, 4)
    for c in range(3):
        rows = flat[labels == c]
        expected_mean[c] = 0.8 * mean[c] + 0.2 * rows.mean(0)
        if len(rows) > 1:
            expected_var[c] = 0.8 * var[c] + 0.2 * rows.var(0, unbiased=True)
    update_statistics(mean, var, feats, labels, momentum=0.8)
    assert torch.allclose(mean, expected_mean, atol=1e-6)
    assert torch.allclose(var, expected_var, atol=1e-6)


def test_sample_count_rate_is_the_authors_rule():
    """mean_c <- (1 - r_c) mean_c + r_c batch mean_c with r_c = min(1, n_c / 5000), by hand."""
    mean, var = torch.zeros(3, 2), torch.ones(3, 2)
    feats = torch.tensor([[1.0, 2.0], [3.0, 2.0], [5.0, 8.0]])
    labels = torch.tensor([0, 0, 2])
    update_statistics(mean, var, feats, labels, momentum=0.9, rate_samples=4)
    # class 0: n = 2, r = 0.5, batch mean (2, 2), unbiased var (2, 0); class 1 absent;
    # class 2: n = 1, r = 0.25, mean moves, the variance of one sample does not exist
    assert torch.allclose(mean, torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.25, 2.0]]))
    assert torch.allclose(var, torch.tensor([[1.5, 0.5], [1.0, 1.0], [1.0, 1.0]]))
    full = torch.zeros(3, 2), torch.ones(3, 2)
    update_statistics(*full, feats, labels, momentum=0.9, rate_samples=1)  # r capped at 1
    assert torch.allclose(full[0], torch.tensor([[2.0, 2.0], [0.0, 0.0], [5.0, 8.0]]))


def test_statistics_converge_to_the_true_per_class_moments():
    true_mean = torch.tensor([[0.0, 2.0, -1.0], [3.0, 0.5, 1.0]])
    true_std = torch.tensor([[1.0, 0.5, 2.0], [0.2, 1.5, 1.0]])
    mean, var = torch.zeros(2, 3), torch.ones(2, 3)
    g, batch, momentum = gen(3), 64, 0.99
    for _ in range(1500):
        labels = torch.randint(0, 2, (batch,), generator=g)
        feats = true_mean[labels] + true_std[labels] * torch.randn(batch, 3, generator=g)
        update_statistics(mean, var, feats, labels, momentum)
    # The moving average weighs about (1 + m) / (1 - m) batches of ~32 samples per class
    # (~6,000 samples): the mean's standard error is std / 77 and the std's about std / 110.
    # 5 standard errors: a wrong update rule (e.g. biased variance, no momentum) fails.
    n_eff = 32 * (1 + momentum) / (1 - momentum)
    assert torch.all((mean - true_mean).abs() <= 5 * true_std / math.sqrt(n_eff))
    assert torch.all((var.sqrt() - true_std).abs() <= 5 * true_std / math.sqrt(2 * n_eff))


def test_server_aggregate_is_the_weighted_combination():
    means = [torch.randn(4, 5, generator=gen(i)) for i in range(3)]
    variances = [torch.rand(4, 5, generator=gen(10 + i)) for i in range(3)]
    weights = [0.5, 0.3, 0.2]
    mean, var = aggregate_statistics(means, variances, weights)
    for c in range(4):
        for d in range(5):
            assert mean[c, d].item() == pytest.approx(
                sum(w * m[c, d].item() for w, m in zip(weights, means, strict=True)), abs=1e-6
            )
            assert var[c, d].item() == pytest.approx(
                sum(w * v[c, d].item() for w, v in zip(weights, variances, strict=True)), abs=1e-6
            )


def test_noise_on_uploaded_statistics_has_the_requested_std():
    mean, var = torch.zeros(50, 200), torch.full((50, 200), 4.0)
    same_mean, same_var = add_noise(mean, var, 0.0, gen(0))
    assert same_mean is mean and same_var is var
    noisy_mean, noisy_var = add_noise(mean, var, 0.5, gen(0))
    # 10,000 draws: the empirical std is within 3% of 0.5 with overwhelming probability.
    assert noisy_mean.std().item() == pytest.approx(0.5, rel=0.03)
    assert (noisy_var.sqrt() - 2.0).std().item() == pytest.approx(0.5, rel=0.03)


def test_balanced_labels_are_balanced():
    labels = balanced_labels(10, 37, gen(0))
    counts = torch.bincount(labels, minlength=10)
    assert len(labels) == 37 and counts.min() == 3 and counts.max() == 4
    assert counts.sum() == 37 and (counts == 4).sum() == 7


def test_sampled_features_have_the_requested_per_class_moments():
    mean = torch.tensor([[1.0, -2.0, 0.0, 5.0], [0.0, 0.0, 3.0, -1.0], [2.0, 2.0, 2.0, 2.0]])
    std = torch.tensor([[0.5, 1.0, 2.0, 0.1], [1.0, 1.0, 1.0, 1.0], [3.0, 0.2, 0.7, 1.5]])
    feats, labels = sample_features(mean, std**2, 30_000, gen(4))
    assert not feats.requires_grad
    assert torch.bincount(labels).tolist() == [10_000] * 3
    for c in range(3):
        rows = feats[labels == c]
        # 10,000 draws per class: 5 standard errors of the mean and of the std.
        assert torch.all((rows.mean(0) - mean[c]).abs() <= 5 * std[c] / 100)
        assert torch.all((rows.std(0) - std[c]).abs() <= 5 * std[c] / math.sqrt(2 * 10_000))
    clipped, clipped_labels = sample_features(mean, std**2, 30_000, gen(4), std_clip=0.3)
    for c in range(3):
        rows = clipped[clipped_labels == c]
        expected = std[c].clamp_max(0.3)
        assert torch.all((rows.std(0) - expected).abs() <= 5 * expected / math.sqrt(2 * 10_000))


# --- the split and the decoupled objective ------------------------------------------------


def small_cnn(seed: int = 0, norm: str = "none"):
    spec = ModelSpec(arch="simple_cnn", channels=[4, 8], fc_width=16, norm=norm)
    return build_model(spec, (1, 8, 8), 10, seed)


@pytest.mark.parametrize(
    "arch,expected", [("simple_cnn", "conv2"), ("resnet18", "layer2"), ("resnet20", "layer2")]
)
def test_default_split_is_the_middle_point(arch, expected):
    model = build_model(ModelSpec(arch=arch, width=4), (1, 8, 8), 10, 0)
    assert resolve_split(model.split_points(), None) == expected
    low, high = model.split(expected)
    x = torch.randn(3, 1, 8, 8, generator=gen(0))
    assert torch.equal(high(low(x)), model(x))


def test_spec_validate_rejects_an_invalid_split_point_with_exit_2(tmp_path, monkeypatch, capsys):
    def validate(split: str) -> tuple[int, str]:
        spec = {**TINY_SPEC, "model": {"arch": "simple_cnn", "channels": [4, 8], "fc_width": 16}}
        spec["algorithm"] = {"name": "fedimpro", "split": split}
        path = write_spec(tmp_path / f"{split}.yaml", spec)
        monkeypatch.setattr(sys, "argv", ["fedhet", "spec", "validate", str(path)])
        try:
            main()
            code = 0
        except SystemExit as exit:
            code = exit.code
        return code, capsys.readouterr().err

    code, err = validate("fc9")
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line == (
        f"error: {tmp_path / 'fc9.yaml'}: algorithm.split: 'fc9' is not a split point of this "
        "model; choose one of ['conv1', 'conv2', 'fc1']"
    )
    assert validate("fc1") == (0, "")


def test_low_level_gradient_is_the_plain_one_and_sampled_features_get_none():
    model = small_cnn()
    low, high = model.split("conv2")
    x, y = torch.randn(6, 1, 8, 8, generator=gen(1)), torch.tensor([0, 1, 2, 0, 1, 2])
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters()}
    sampled = torch.randn(4, 8, 2, 2, generator=gen(2), requires_grad=True)
    sampled_labels = torch.tensor([3, 4, 5, 6])
    model.zero_grad()
    decoupled_loss(high, low(x), y, sampled, sampled_labels, real_share=0.6).backward()
    groups = parameter_groups(model, "conv2")
    assert groups["low"] == [
        "features.conv1.0.weight",
        "features.conv1.0.bias",
        "features.conv2.0.weight",
        "features.conv2.0.bias",
    ]
    params = dict(model.named_parameters())
    for name in groups["low"]:
        assert torch.allclose(params[name].grad, plain[name], rtol=1e-5, atol=1e-7), name
    assert sampled.grad is None  # detached: nothing flows back into the sampled features
    # The high-level gradient is the 0.6 / 0.4 mixture of the real and sampled CE gradients.
    model.zero_grad()
    F.cross_entropy(high(sampled.detach()), sampled_labels).backward()
    fake = {n: params[n].grad.clone() for n in groups["high"]}
    model.zero_grad()
    decoupled_loss(high, low(x), y, sampled, sampled_labels, real_share=0.6).backward()
    for name in groups["high"]:
        expected = 0.6 * plain[name] + 0.4 * fake[name]
        assert torch.allclose(params[name].grad, expected, rtol=1e-5, atol=1e-7), name


def test_official_objective_adds_the_weighted_sampled_gradient_to_the_plain_one():
    model = small_cnn()
    low, high = model.split("conv2")
    params = dict(model.named_parameters())
    x, y = torch.randn(6, 1, 8, 8, generator=gen(1)), torch.tensor([0, 1, 2, 0, 1, 2])
    sampled = torch.randn(4, 8, 2, 2, generator=gen(2), requires_grad=True)
    sampled_labels = torch.tensor([3, 4, 5, 6])

    def grads(loss_fn):
        model.zero_grad()
        loss_fn().backward()
        return {n: p.grad.clone() if p.grad is not None else 0 for n, p in params.items()}

    plain = grads(lambda: F.cross_entropy(model(x), y))
    fake = grads(lambda: F.cross_entropy(high(sampled.detach()), sampled_labels))
    official = grads(lambda: official_loss(high, low(x), y, sampled, sampled_labels, 0.3))
    assert sampled.grad is None
    for name in params:
        expected = plain[name] + 0.3 * fake[name]  # fake is 0 on the low-level part
        assert torch.allclose(official[name], expected, rtol=1e-5, atol=1e-7), name


# --- the algorithm in the engine ---------------------------------------------------------


def digits_spec(algorithm: dict, rounds: int = 2) -> Spec:
    return parse_spec(
        {
            "data": {"dataset": "digits"},
            "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.3},
            "model": {"arch": "simple_cnn", "channels": [4, 8], "fc_width": 16},
            "federation": {"rounds": rounds, "clients_per_round": 3, "local_steps": 5, "lr": 0.05},
            "algorithm": algorithm,
            "runtime": {"progress": False, "checkpoint_every": 1},
        }
    )


def test_defaults_are_the_authors_objective_ramp_and_std_clip():
    config = digits_spec({"name": "fedimpro"}).algorithm
    assert (config.objective, config.weight, config.std_clip) == ("official", 1.0, 0.1)
    assert (config.ramp_rounds, config.ramp) == (500, None)


@pytest.mark.parametrize(
    ("options", "rounds", "expected"),
    [
        ({}, 40, [0.0, 0.002, 0.04, 0.078]),  # the authors' t / 500 in absolute rounds
        ({"ramp_rounds": 20, "weight": 0.5}, 40, [0.0, 0.025, 0.5, 0.975]),
        ({"ramp": 0.5}, 40, [0.0, 0.05, 1.0, 1.95]),  # w at half the run
        ({"ramp": 0.25, "weight": 0.5}, 40, [0.0, 0.05, 1.0, 1.95]),
        ({"ramp": 0}, 40, [1.0, 1.0, 1.0, 1.0]),
        ({"ramp": 0.5, "ramp_cap": True}, 40, [0.0, 0.05, 1.0, 1.0]),  # held at w from R on
        ({"ramp_rounds": 20, "weight": 0.5, "ramp_cap": True}, 40, [0.0, 0.025, 0.5, 0.5]),
    ],
)
def test_sampled_weight_rises_linearly_and_uncapped_unless_capped(options, rounds, expected):
    setup = build_setup(digits_spec({"name": "fedimpro", **options}, rounds))
    algo = FedImpro(setup.spec.algorithm, setup)
    got = [algo.sampled_weight(t) for t in (0, 1, rounds // 2, rounds - 1)]
    assert got == pytest.approx(expected)


def test_a_fractional_ramp_replaces_the_default_ramp_rounds_and_only_it_depends_on_the_total():
    spec = digits_spec({"name": "fedimpro", "ramp": 0.5}, 4)
    assert spec.algorithm.ramp_rounds is None
    assert not spec.algorithm.extendable(spec, 2)
    spec = digits_spec({"name": "fedimpro"}, 4)
    assert spec.algorithm.extendable(spec, 2)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ramp": 0.5, "ramp_rounds": 100}, "give either ramp (a fraction of the run) or "),
        ({"ramp_rounds": None}, "ramp_rounds is null: give ramp"),
        ({"rate_samples": 5000, "momentum": 0.5}, "give either momentum or rate_samples"),
    ],
)
def test_conflicting_ramp_or_rate_options_are_one_line_errors(
    options, message, tmp_path, monkeypatch, capsys
):
    spec = {**TINY_SPEC, "algorithm": {"name": "fedimpro", **options}}
    path = write_spec(tmp_path / "s.yaml", spec)
    monkeypatch.setattr(sys, "argv", ["fedhet", "spec", "validate", str(path)])
    with pytest.raises(SystemExit) as exit:
        main()
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exit.value.code == 2 and message in line


@pytest.mark.parametrize(("source", "centre"), [("global", 0.0), ("client", 50.0)])
def test_sampled_features_come_from_the_chosen_statistics(source, centre, monkeypatch):
    setup = build_setup(digits_spec({"name": "fedimpro", "ramp": 0, "sample_from": source}, 1))
    algo = FedImpro(setup.spec.algorithm, setup)
    model = algo.build_model()
    dim = math.prod(algo.feature_shape)
    drawn = []

    def recording(*args, **kwargs):
        drawn.append(sample_features(*args, **kwargs))
        return drawn[-1]

    monkeypatch.setattr(objective, "sample_features", recording)
    small = torch.full((10, dim), 1e-6)
    job = SimpleNamespace(
        round=0,
        model=model,
        server_state={MEAN: torch.zeros(10, dim), VAR: small},
        generator=gen(0),
    )
    job.context = algo.client_context(job)  # the client's running statistics start as these
    job.context.mean.fill_(50.0)  # and have moved away from the global ones
    client = setup.clients[0]
    algo.local_loss(job, model, client.x[:16], client.y[:16])
    ((features, _),) = drawn
    assert features.mean().item() == pytest.approx(centre, abs=0.01)


def test_weight_zero_is_exactly_fedavg(tmp_path):
    imp = Engine.from_spec(digits_spec({"name": "fedimpro", "weight": 0.0}), tmp_path / "a").run()
    avg = Engine.from_spec(digits_spec({"name": "fedavg"}), tmp_path / "b").run()
    for name, value in avg.global_state.items():
        assert torch.equal(imp.global_state[name], value), name


def test_round_aggregates_the_uploads_and_counts_the_statistics(tmp_path):
    engine = Engine.from_spec(digits_spec({"name": "fedimpro", "split": "conv1"}, 1), tmp_path)
    algo = engine.algorithm
    assert algo.feature_shape == (4, 4, 4)
    # Replay the round's client updates by hand, then run the round itself.
    state, replay = engine.initial_state(), engine.initial_state()
    initial = tensors.clone(replay.server_state)
    uploads = []
    for job in engine.make_jobs(0, replay, sample_clients(0, 0, 4, 3)):
        engine.model.load_state_dict(job.global_state)
        uploads.append(algo.client_update(job).upload)
    engine.run_round(0, state)
    # Eq. 8: the server statistics are the uniform mean of the round's uploads.
    assert torch.allclose(state.server_state[MEAN], sum(u[MEAN] for u in uploads) / 3, atol=1e-6)
    assert torch.allclose(state.server_state[VAR], sum(u[VAR] for u in uploads) / 3, atol=1e-6)
    assert not torch.allclose(state.server_state[MEAN], initial[MEAN])  # clients updated them
    assert all(not s for s in state.client_states.values())  # nothing left behind on clients
    stats_bytes = 2 * 10 * (4 * 4 * 4) * 4  # mean and variance, 10 classes, float32
    per_client = tensors.nbytes(state.global_state) + stats_bytes
    assert state.metrics["bytes_down"] == [3 * per_client]
    assert state.metrics["bytes_up"] == [3 * per_client]


def test_resume_from_a_checkpoint_is_exact(tmp_path):
    algorithm = {"name": "fedimpro", "noise_std": 0.01}
    straight = Engine.from_spec(digits_spec(algorithm, 3), tmp_path / "straight").run()
    interrupted = Engine.from_spec(digits_spec(algorithm, 3), tmp_path / "resumed")
    state = interrupted.initial_state()
    interrupted.run_round(0, state)
    state.round = 1
    interrupted.checkpoints.save(state)
    resumed = Engine.from_spec(digits_spec(algorithm, 3), tmp_path / "resumed").run()
    for name, value in straight.global_state.items():
        assert torch.equal(resumed.global_state[name], value), name
    for name, value in straight.server_state.items():
        assert torch.equal(resumed.server_state[name], value), name


# --- Theorem 4.2 -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained_digits_model():
    """A small CNN after 30 SGD steps on digits, and 5 Dirichlet(0.3) clients."""
    ds = load_dataset("digits")
    part = make_partition(
        parse_spec({"partition": {"scheme": "dirichlet", "clients": 5, "alpha": 0.3}}).partition,
        ds.train_y.numpy(),
        ds.num_classes,
        seed=0,
    )
    clients = [
        ClientData(i, ds.train_x[torch.from_numpy(idx)], ds.train_y[torch.from_numpy(idx)])
        for i, idx in enumerate(part.client_indices)
    ]
    model = build_model(ModelSpec(arch="simple_cnn", channels=[4, 8], fc_width=16), ds.shape, 10, 0)
    opt, g = torch.optim.SGD(model.parameters(), lr=0.05), gen(0)
    for _ in range(30):
        idx = torch.randint(0, len(ds.train_y), (32,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(ds.train_x[idx]), ds.train_y[idx]).backward()
        opt.step()
    return model, clients


def test_class_moments_are_the_exact_per_class_moments(trained_digits_model):
    model, clients = trained_digits_model
    low, _ = model.split("conv2")
    with torch.no_grad():
        batches = [(low(c.x), c.y) for c in clients]
    mean, var = class_moments(iter(batches), 10)
    feats = torch.cat([b[0] for b in batches]).flatten(1)
    labels = torch.cat([b[1] for b in batches])
    for c in range(10):
        assert torch.allclose(mean[c], feats[labels == c].mean(0), atol=1e-5)
        assert torch.allclose(var[c], feats[labels == c].var(0), atol=1e-5)


@pytest.mark.parametrize("ratio", [1.0, 0.5, 3.0])
def test_theorem_4_2_high_level_cgv_shrinks_by_n2_over_n_plus_nhat_squared(
    trained_digits_model, ratio
):
    model, clients = trained_digits_model
    report = decoupled_cgv(model, clients, "conv2", num_classes=10, ratio=ratio, seed=1)
    # The low-level part is untouched: sampled features never reach the low-level parameters.
    assert report["fedimpro_low"] == pytest.approx(report["plain_low"], rel=1e-6)  # float32
    # Each client draws its own N_hat = ratio * N features from the shared Gaussian, so the
    # sampled-feature gradients differ across clients by sampling noise, which the theorem
    # ignores. That noise adds (N_hat/(N+N_hat))^2 times their across-client variance, which
    # falls as 1/N_hat (N = 112..587 here); measured, it moves the ratio by under 1%.
    # 5% still fails the objectives that do not decouple (the sum form CE(real) + CE(sampled)
    # leaves the ratio at ~1; the mean over the concatenation also shrinks the low part).
    measured = report["fedimpro_high"] / report["plain_high"]
    assert measured == pytest.approx(report["theorem_high_factor"], rel=0.05)
    assert report["fedimpro_total"] < report["plain_total"]


def test_official_objective_leaves_the_high_level_cgv_about_unchanged(trained_digits_model):
    # Theorem 4.2's shrinkage is a property of the mixture objective. CE(real) + CE(sampled)
    # adds to every client's high-level gradient nearly the same sampled-feature gradient
    # (the Gaussian is shared; only the draws differ), so the variance across clients stays.
    model, clients = trained_digits_model
    for ratio in (1.0, 3.0):
        report = decoupled_cgv(
            model, clients, "conv2", num_classes=10, ratio=ratio, seed=1, objective="official"
        )
        assert report["fedimpro_low"] == pytest.approx(report["plain_low"], rel=1e-6)
        assert report["fedimpro_high"] / report["plain_high"] == pytest.approx(1.0, abs=0.05)


def test_theorem_4_2_is_exact_when_every_client_gets_the_same_sampled_features(
    trained_digits_model,
):
    model, clients = trained_digits_model
    low, _ = model.split("conv2")
    groups = parameter_groups(model, "conv2")
    with torch.no_grad():
        mean, var = class_moments(((low(c.x), c.y) for c in clients), 10)
    sampled, sampled_labels = sample_features(mean, var, 200, gen(5))

    def same_for_everyone(m, x, y):
        lo, hi = m.split("conv2")
        features = lo(x)
        return decoupled_loss(
            hi, features, y, sampled.view(200, *features.shape[1:]), sampled_labels, real_share=0.4
        )

    plain = client_gradient_variance(model, clients, groups=groups)
    shared = client_gradient_variance(model, clients, groups=groups, loss_fn=same_for_everyone)
    assert shared["low"] == pytest.approx(plain["low"], rel=1e-6)
    assert shared["high"] == pytest.approx(0.4**2 * plain["high"], rel=1e-5)
