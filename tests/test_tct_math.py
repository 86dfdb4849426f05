"""TCT numerics: eNTK features against the per-sample reference, and stage-2 regression."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

from fedhet.core.errors import InputError, RunError
from fedhet.core.spec import ModelSpec
from fedhet.methods.tct import per_sample
from fedhet.methods.tct.entk import (
    coordinate_mask,
    entk_features,
    entk_features_loop,
    iter_entk_chunks,
    reinit_head,
    trainable_parameter_count,
)
from fedhet.methods.tct.moments import FeatureMoments
from fedhet.methods.tct.per_sample import _FULL_SAMPLES
from fedhet.methods.tct.regression import centered_one_hot, lstsq_loss, predict, solve
from fedhet.models import build_model

torch.set_num_threads(1)

SMALL_CNN = {"arch": "simple_cnn", "channels": [3, 4], "fc_width": 8}
MODELS = {
    "simple_cnn": (SMALL_CNN, (1, 8, 8)),
    "simple_cnn_bn": ({**SMALL_CNN, "norm": "batch"}, (1, 8, 8)),
    "simple_cnn_gn": ({**SMALL_CNN, "channels": [4, 4], "norm": "group"}, (1, 8, 8)),
    "resnet20_bn": ({"arch": "resnet20", "width": 2, "norm": "batch"}, (3, 8, 8)),
}


def _model(name: str, dtype: torch.dtype = torch.float32) -> nn.Module:
    """A small fedhet model, head re-drawn, non-trivial BatchNorm statistics, in train mode."""
    fields, shape = MODELS[name]
    model = build_model(ModelSpec(**fields), shape, 10, seed=0).to(dtype)
    generator = torch.Generator().manual_seed(1)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.running_mean.copy_(
                torch.rand(module.running_mean.shape, generator=generator) - 0.5
            )
            module.running_var.copy_(
                torch.rand(module.running_var.shape, generator=generator) + 0.5
            )
            module.weight.data.copy_(torch.rand(module.weight.shape, generator=generator) + 0.5)
            module.bias.data.copy_(torch.rand(module.bias.shape, generator=generator) - 0.5)
    reinit_head(model, seed=3)
    return model.train()


def _inputs(
    name: str, count: int, seed: int = 0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    return torch.randn(
        count, *MODELS[name][1], generator=torch.Generator().manual_seed(seed), dtype=dtype
    )


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).norm() / expected.norm())


# --- eNTK features ----------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("kept", [50, 3, 1])  # 1/50: convs gather pairs; 1/3, all: whole
def test_batched_features_equal_per_sample_loop(name: str, kept: int) -> None:
    model = _model(name)
    total = trainable_parameter_count(model)
    coords = coordinate_mask(total, total // kept, seed=5)
    x = _inputs(name, 12)
    batched = entk_features(model, x, coords, batch_size=5)
    reference = entk_features_loop(model, x, coords)
    assert batched.shape == (12, coords.numel())
    assert _relative_error(batched, reference) < 1e-5
    assert model.training and all(module.training for module in model.modules())


class _UncommonLayers(nn.Module):
    """Grouped, 'same'-padded, strided and dilated convs (one with a non-square kernel, stride,
    dilation and padding), a Linear on 3-D input, a reused Linear."""

    def __init__(self) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.grouped = nn.Conv2d(2, 4, 3, groups=2, padding="same")
            self.dilated = nn.Conv2d(4, 4, 3, stride=2, padding=2, dilation=2, bias=False)
            self.uneven = nn.Conv2d(4, 4, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2))
            self.per_row = nn.Linear(4, 3)
            self.shared = nn.Linear(12, 12)
            self.head = nn.Linear(12, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.dilated(torch.relu(self.grouped(x))))  # [B, 4, 4, 4]
        hidden = torch.relu(self.uneven(hidden))  # [B, 4, 2, 2]
        rows = torch.tanh(self.per_row(hidden.flatten(2)))  # a Linear on [B, 4, 4]
        flat = rows.flatten(1)
        return self.head(torch.tanh(self.shared(torch.tanh(self.shared(flat)))))


@pytest.mark.parametrize("conv_path", ["gather", "whole"])
def test_uncommon_layers_and_reused_modules_match_the_loop(
    conv_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a convolution gathers the selected pairs or takes its whole per-sample gradient, by cost
    monkeypatch.setattr(per_sample, "_GATHER_COST", 0 if conv_path == "gather" else 10**9)
    model = _UncommonLayers()
    coords = coordinate_mask(trainable_parameter_count(model), 10_000, seed=0)
    x = torch.randn(6, 2, 8, 8, generator=torch.Generator().manual_seed(3))
    batched = entk_features(model, x, coords, batch_size=4)
    assert _relative_error(batched, entk_features_loop(model, x, coords)) < 1e-5


@pytest.mark.parametrize("conv_path", ["gather", "whole"])
def test_both_convolution_paths_match_the_loop_on_a_strided_resnet(
    conv_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(per_sample, "_GATHER_COST", 0 if conv_path == "gather" else 10**9)
    model = _model("resnet20_bn")
    coords = coordinate_mask(trainable_parameter_count(model), 400, seed=4)
    x = _inputs("resnet20_bn", 7)
    batched = entk_features(model, x, coords, batch_size=3)
    assert _relative_error(batched, entk_features_loop(model, x, coords)) < 1e-5


def test_a_chunk_larger_than_one_whole_gradient_block_matches_the_loop() -> None:
    model = _model("simple_cnn")  # every coordinate: the convolutions take the whole path
    coords = coordinate_mask(trainable_parameter_count(model), 10**6, seed=0)
    x = _inputs("simple_cnn", 2 * _FULL_SAMPLES + 6)  # 32 + 32 + 6 samples in one chunk
    batched = entk_features(model, x, coords, batch_size=len(x))
    assert _relative_error(batched, entk_features_loop(model, x, coords)) < 1e-5


class _UnusedBranch(nn.Module):
    """A Linear whose output is thrown away and one that is never called: zero gradients."""

    def __init__(self) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.hidden = nn.Linear(6, 5)
            self.ignored = nn.Linear(6, 4)
            self.never = nn.Linear(2, 2)
            self.head = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.ignored(x)
        return self.head(torch.tanh(self.hidden(x)))


def test_modules_that_do_not_reach_the_logit_get_zero_features() -> None:
    model = _UnusedBranch()
    coords = coordinate_mask(trainable_parameter_count(model), 10**6, seed=0)
    x = torch.randn(7, 6, generator=torch.Generator().manual_seed(2))
    batched = entk_features(model, x, coords, batch_size=4)
    torch.testing.assert_close(batched, entk_features_loop(model, x, coords))
    start = model.hidden.weight.numel() + model.hidden.bias.numel()
    dead = model.ignored.weight.numel() + model.ignored.bias.numel() + 6  # and `never`
    assert batched[:, start : start + dead].eq(0).all()
    assert batched[:, :start].ne(0).any() and batched[:, start + dead :].ne(0).any()


def test_features_are_the_first_logit_gradient_in_parameter_order() -> None:
    model = _model("simple_cnn")
    x = _inputs("simple_cnn", 1)
    model.eval()
    model(x)[0, 0].backward()
    expected = torch.cat([param.grad.flatten() for param in model.parameters()])
    coords = coordinate_mask(expected.numel(), 50, seed=2)
    assert torch.allclose(
        entk_features(model, x, coords)[0], expected[coords], rtol=1e-5, atol=1e-7
    )


def test_features_do_not_depend_on_batch_mates_in_eval_semantics() -> None:
    model = _model("simple_cnn_bn")
    coords = coordinate_mask(trainable_parameter_count(model), 200, seed=9)
    train, test = _inputs("simple_cnn_bn", 7, seed=1), _inputs("simple_cnn_bn", 3, seed=2)
    together = entk_features(model, torch.cat([train, test]), coords, batch_size=10)
    alone = entk_features(model, test, coords, batch_size=3)
    assert torch.allclose(together[7:], alone, rtol=1e-5, atol=1e-6)


def test_coordinate_mask_is_a_seeded_sorted_subset() -> None:
    mask = coordinate_mask(1000, 100, seed=4)
    assert torch.equal(mask, coordinate_mask(1000, 100, seed=4))  # same mask for train and test
    assert not torch.equal(mask, coordinate_mask(1000, 100, seed=5))
    assert mask.dtype == torch.long and mask.numel() == 100
    assert bool((mask[1:] > mask[:-1]).all()) and 0 <= int(mask.min()) and int(mask.max()) < 1000
    assert torch.equal(coordinate_mask(1000, 5000, seed=4), torch.arange(1000))
    with pytest.raises(InputError, match="p"):
        coordinate_mask(1000, 0, seed=4)


def test_reinit_head_is_seeded_and_touches_only_the_head() -> None:
    first, second = _model("simple_cnn"), _model("simple_cnn")
    features_before = [param.clone() for param in first.features.parameters()]
    reinit_head(first, seed=11)
    reinit_head(second, seed=11)
    assert torch.equal(first.head.weight, second.head.weight) and torch.equal(
        first.head.bias, second.head.bias
    )
    assert all(
        torch.equal(a, b) for a, b in zip(features_before, first.features.parameters(), strict=True)
    )
    reinit_head(second, seed=12)
    assert not torch.equal(first.head.weight, second.head.weight)
    with pytest.raises(InputError, match="head"):
        reinit_head(nn.Sequential(nn.Linear(3, 2)), seed=0)


@pytest.mark.parametrize("name", ["simple_cnn", "simple_cnn_bn"])
def test_features_linearize_the_first_logit(name: str) -> None:
    """f_1(x; theta0 + d) - f_1(x; theta0) = phi(x) . d + O(|d|^2)."""
    model = _model(name, torch.float64).eval()
    total = trainable_parameter_count(model)
    x = _inputs(name, 10, dtype=torch.float64)
    phi = entk_features(model, x, coordinate_mask(total, total, seed=0))
    names = [n for n, _ in model.named_parameters()]
    theta = torch.cat([param.detach().flatten() for param in model.parameters()])
    direction = torch.randn(total, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    direction *= theta.norm() / direction.norm()

    def first_logit(vector: torch.Tensor) -> torch.Tensor:
        pieces = torch.split(vector, [param.numel() for param in model.parameters()])
        params = {
            n: piece.view_as(p)
            for n, piece, p in zip(names, pieces, model.parameters(), strict=True)
        }
        with torch.no_grad():
            return functional_call(model, params, (x,))[:, 0]

    def remainder(scale: float) -> tuple[float, float]:
        step = scale * direction
        linear = phi @ step
        rest = first_logit(theta + step) - first_logit(theta) - linear
        return float(rest.norm()), float(rest.norm() / linear.norm())

    big, big_relative = remainder(1e-4)
    small, _ = remainder(5e-5)
    assert big_relative < 1e-3
    assert 3.5 < big / small < 4.5  # second-order remainder: halving d quarters it


def test_streamed_chunks_concatenate_to_the_one_shot_features() -> None:
    model = _model("simple_cnn_bn")
    coords = coordinate_mask(trainable_parameter_count(model), 100, seed=1)
    x = _inputs("simple_cnn_bn", 10)
    chunks = list(iter_entk_chunks(model, x, coords, chunk=3))
    assert [chunk.shape[0] for chunk in chunks] == [3, 3, 3, 1]
    assert torch.allclose(
        torch.cat(chunks), entk_features(model, x, coords, batch_size=10), rtol=1e-5, atol=1e-7
    )


def test_feature_moments_merge_equals_moments_of_the_concatenation() -> None:
    generator = torch.Generator().manual_seed(0)
    blocks = [torch.randn(n, 6, generator=generator) * 3 + 5 for n in (4, 1, 9)]
    blocks[1][:, 0] = blocks[0][0, 0]
    per_client = [FeatureMoments.of(block) for block in blocks]
    merged = per_client[0].merge(per_client[1]).merge(per_client[2]).merge(FeatureMoments.empty(6))
    streamed = FeatureMoments.empty(6)
    for block in blocks:
        streamed.update(block)
    union = torch.cat(blocks).double()
    for moments in (merged, streamed):
        assert moments.count == 14
        assert torch.allclose(moments.mean, union.mean(dim=0), rtol=1e-12, atol=1e-12)
        assert torch.allclose(moments.std(), union.std(dim=0, correction=0), rtol=1e-12)
    standardized = merged.standardize(torch.cat(blocks)).double()
    assert torch.allclose(standardized.mean(dim=0), torch.zeros(6, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(
        standardized.std(dim=0, correction=0), torch.ones(6, dtype=torch.float64), atol=1e-5
    )


def test_feature_moments_floor_keeps_constant_columns_finite() -> None:
    block = torch.tensor([[1.0, 0.0], [1.0, 2.0]])
    moments = FeatureMoments.of(block)
    assert moments.std(floor=1e-6)[0] == 1e-6
    assert torch.equal(moments.standardize(block)[:, 0], torch.zeros(2))


# --- stage-2 regression -----------------------------------------------------------------


def _clustered_clients(
    sizes: tuple[int, ...] = (25, 25, 25, 25), dim: int = 6, spread: float = 3.0, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A #C=1-like instance: client k sees only class k, its features one cluster."""
    generator = torch.Generator().manual_seed(seed)
    clients = []
    for label, count in enumerate(sizes):
        center = spread * torch.randn(dim, generator=generator, dtype=torch.float64)
        features = center + torch.randn(count, dim, generator=generator, dtype=torch.float64)
        clients.append(
            (features, centered_one_hot(torch.full((count,), label), len(sizes)).double())
        )
    return clients


def _stable_lr(clients: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Half the inverse of the largest client curvature: every local GD step contracts."""
    largest = 0.0
    for features, _ in clients:
        with_bias = torch.cat(
            [features, torch.ones(features.shape[0], 1, dtype=features.dtype)], dim=1
        )
        largest = max(
            largest, float(torch.linalg.eigvalsh(with_bias.T @ with_bias / features.shape[0]).max())
        )
    return 0.5 / largest


def _explicit_loss(clients, shares, weight, bias) -> float:
    return sum(
        share * float((z @ weight + bias - y).square().sum()) / (2 * z.shape[0])
        for share, (z, y) in zip(shares, clients, strict=True)
    )


def test_centered_targets_and_prediction() -> None:
    targets = centered_one_hot(torch.tensor([2, 0]), 4)
    assert torch.allclose(targets.sum(dim=1), torch.zeros(2)) and targets[0, 2] == pytest.approx(
        0.75
    )
    weight, bias = torch.eye(3), torch.tensor([0.0, 0.0, 0.5])
    assert torch.equal(
        predict(torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.2, 0.0]]), weight, bias),
        torch.tensor([0, 2]),
    )


def test_scaffold_reaches_the_least_squares_optimum() -> None:
    clients = _clustered_clients(sizes=(20, 35, 25, 30))
    result = solve(clients, "scaffold", rounds=200, local_steps=50, lr=_stable_lr(clients))
    optimum = lstsq_loss(clients)
    assert optimum > 0
    assert result.train_loss[-1] <= optimum * 1.01
    assert result.train_loss[-1] >= optimum * (1 - 1e-9)
    shares = [n / 110 for n in (20, 35, 25, 30)]
    assert result.train_loss[-1] == pytest.approx(
        _explicit_loss(clients, shares, result.weight, result.bias), rel=1e-9
    )


@pytest.mark.parametrize("weights", [None, [1.0, 3.0, 0.5, 2.0]])
def test_scaffold_controls_sum_to_zero_after_every_round(weights: list[float] | None) -> None:
    sizes = (10, 30, 20, 15)
    clients = _clustered_clients(sizes=sizes)
    raw = weights or [float(n) for n in sizes]
    shares = [w / sum(raw) for w in raw]
    for rounds in (1, 2, 5):
        result = solve(
            clients,
            "scaffold",
            rounds=rounds,
            local_steps=20,
            lr=_stable_lr(clients),
            weights=weights,
        )
        assert result.controls is not None
        weighted = sum(
            share * control for share, control in zip(shares, result.controls, strict=True)
        )
        assert float(weighted.abs().max()) < 1e-10 * max(
            float(c.abs().max()) for c in result.controls
        )
        assert float(result.controls[0].abs().max()) > 0


def test_fedavg_drifts_on_one_class_per_client_while_scaffold_does_not() -> None:
    clients = _clustered_clients()
    lr = _stable_lr(clients)
    scaffold = solve(clients, "scaffold", rounds=40, local_steps=100, lr=lr)
    fedavg = solve(clients, "fedavg", rounds=40, local_steps=100, lr=lr)
    assert fedavg.controls is None
    assert fedavg.train_loss[-1] > 2 * scaffold.train_loss[-1]
    assert fedavg.train_loss[-1] > 2 * lstsq_loss(clients)


def test_gd_is_full_batch_descent_on_the_union() -> None:
    clients = _clustered_clients(sizes=(12, 30, 18, 20))
    union = [(torch.cat([z for z, _ in clients]), torch.cat([y for _, y in clients]))]
    lr = _stable_lr(clients)
    options = {"rounds": 4, "local_steps": 10, "lr": lr, "solver": "explicit"}
    split = solve(clients, "gd", step_form="explicit", **options)
    pooled = solve(union, "gd", step_form="explicit", **options)
    assert torch.allclose(split.weight, pooled.weight, rtol=1e-10, atol=1e-12)
    assert split.train_loss == pytest.approx(pooled.train_loss, rel=1e-10)


@pytest.mark.parametrize("algorithm", ["scaffold", "fedavg", "gd"])
def test_gram_steps_equal_explicit_steps(algorithm: str) -> None:
    clients = _clustered_clients(sizes=(8, 40, 15, 25), dim=12)
    lr = _stable_lr(clients)
    runs = {
        form: solve(
            clients, algorithm, rounds=3, local_steps=15, lr=lr, solver="explicit", step_form=form
        )
        for form in ("gram", "explicit", "auto")
    }
    for form in ("gram", "auto"):
        assert torch.allclose(runs[form].weight, runs["explicit"].weight, rtol=1e-9, atol=1e-12)
        assert torch.allclose(runs[form].bias, runs["explicit"].bias, rtol=1e-9, atol=1e-12)
        assert runs[form].train_loss == pytest.approx(runs["explicit"].train_loss, rel=1e-9)


def test_on_round_reports_every_round_with_the_server_model() -> None:
    clients = _clustered_clients()
    seen: list[tuple[int, float]] = []
    shares = [0.25] * 4
    result = solve(
        clients,
        "scaffold",
        rounds=4,
        local_steps=10,
        lr=_stable_lr(clients),
        on_round=lambda t, w, b, _: seen.append((t, _explicit_loss(clients, shares, w, b))),
    )
    assert [t for t, _ in seen] == [1, 2, 3, 4]
    assert [loss for _, loss in seen] == pytest.approx(result.train_loss, rel=1e-9)
    assert result.weight.shape == (6, 4) and result.bias.shape == (4,)


@pytest.mark.parametrize(
    "algorithm, weights", [("scaffold", None), ("gd", None), ("gd", [0.0, 1.0, 2.0, 1.0])]
)
def test_on_round_scores_are_the_server_models_training_predictions(
    algorithm: str, weights: list[float] | None
) -> None:
    clients = _clustered_clients()
    checked: list[int] = []

    def check(t: int, weight: torch.Tensor, bias: torch.Tensor, scores: list) -> None:
        assert len(scores) == len(clients)
        for (z, _), score in zip(clients, scores, strict=True):
            assert score.dtype == torch.float64
            assert torch.allclose(score, z @ weight + bias, rtol=1e-9, atol=1e-12)
        checked.append(t)

    lr = _stable_lr(clients)
    solve(clients, algorithm, rounds=3, local_steps=10, lr=lr, weights=weights, on_round=check)
    assert checked == [1, 2, 3]


def test_divergence_raises_run_error_naming_the_round() -> None:
    clients = _clustered_clients()
    with pytest.raises(RunError, match=r"round 1\b"):
        solve(clients, "scaffold", rounds=5, local_steps=50, lr=1e3)
    finished: list[int] = []
    with pytest.raises(RunError, match="round") as caught:
        solve(
            clients,
            "fedavg",
            rounds=200,
            local_steps=10,
            lr=10 * _stable_lr(clients),
            on_round=lambda t, w, b, _: finished.append(t),
        )
    assert finished and f"round {finished[-1] + 1}:" in str(caught.value)


def test_bad_stage2_inputs_are_input_errors() -> None:
    clients = _clustered_clients()
    with pytest.raises(InputError, match="algorithm"):
        solve(clients, "sgd", rounds=1, local_steps=1, lr=0.1)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="weights"):
        solve(clients, "fedavg", rounds=1, local_steps=1, lr=0.1, weights=[1.0])
    with pytest.raises(InputError, match="rows"):
        solve([(torch.zeros(3, 6), torch.zeros(2, 4))], "gd", rounds=1, local_steps=1, lr=0.1)
