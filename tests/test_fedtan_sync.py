"""FedTAN's synchronized BN step: the p-weighted client gradients equal the centralized one."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.core.errors import InputError, RunError
from fedhet.core.spec import ModelSpec
from fedhet.methods.fedtan.sync_bn import (
    bn_layers,
    communication_cost,
    synchronized_gradients,
)
from fedhet.models import build_model

torch.set_num_threads(1)
NUM_CLASSES = 10


# --- models and data ----------------------------------------------------------------------


class TinyResNet(nn.Module):
    """Conv stem, a residual block, a strided conv, then BN1d on the pooled features."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU()
        )
        self.conv_a = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn_a = nn.BatchNorm2d(4)
        self.conv_b = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn_b = nn.BatchNorm2d(4)
        self.down = nn.Sequential(
            nn.Conv2d(4, 6, 3, stride=2, padding=1),
            nn.BatchNorm2d(6),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.BatchNorm1d(6),
        )
        self.head = nn.Linear(6, NUM_CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        x = torch.relu(x + self.bn_b(self.conv_b(torch.relu(self.bn_a(self.conv_a(x))))))
        return self.head(self.down(x))


def tiny_resnet() -> nn.Module:
    torch.manual_seed(0)  # tests only: a fixed init for the local model
    return TinyResNet().double()


def fedhet_mlp() -> nn.Module:
    spec = ModelSpec(arch="mlp", hidden=[30], norm="batch")
    return build_model(spec, (1, 6, 6), NUM_CLASSES, seed=0).double()


def fedhet_resnet20() -> nn.Module:
    spec = ModelSpec(arch="resnet20", norm="batch", width=4)
    return build_model(spec, (3, 8, 8), NUM_CLASSES, seed=0).double()


def plain_mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.BatchNorm1d(7), nn.ReLU(), nn.Linear(7, 4)).double()


IN_SHAPES = {
    fedhet_mlp: (1, 6, 6),
    tiny_resnet: (3, 8, 8),
    fedhet_resnet20: (3, 8, 8),
    plain_mlp: (5,),
}


def non_iid_batches(build, sizes: list[int], seed: int = 0) -> list[tuple[Tensor, Tensor]]:
    """Client i: classes {2i, 2i+1} and inputs shifted by i and scaled by 1 + i/2."""
    gen = torch.Generator().manual_seed(seed)
    shape = IN_SHAPES[build]
    classes = NUM_CLASSES if build is not plain_mlp else 4
    batches = []
    for i, size in enumerate(sizes):
        x = torch.randn(size, *shape, generator=gen, dtype=torch.float64) * (1 + i / 2) + i
        y = (2 * i + torch.randint(0, 2, (size,), generator=gen)) % classes
        batches.append((x, y))
    return batches


def shares(batches) -> list[float]:
    total = sum(len(y) for _, y in batches)
    return [len(y) / total for _, y in batches]


def centralized_gradients(model: nn.Module, batches) -> dict[str, Tensor]:
    """Train mode, one forward of the concatenated union batch, loss = mean over the union."""
    reference = copy.deepcopy(model)
    x = torch.cat([x for x, _ in batches])
    y = torch.cat([y for _, y in batches])
    named = list(reference.named_parameters())
    grads = torch.autograd.grad(F.cross_entropy(reference(x), y), [p for _, p in named])
    return {n: g for (n, _), g in zip(named, grads, strict=True)}


def weighted_average(gradients: list[dict[str, Tensor]], weights: list[float]) -> dict[str, Tensor]:
    return {n: sum(w * g[n] for w, g in zip(weights, gradients, strict=True)) for n in gradients[0]}


def relative_error(a: dict[str, Tensor], b: dict[str, Tensor]) -> float:
    diff = torch.cat([(a[n] - b[n]).flatten() for n in b])
    return float(diff.norm() / torch.cat([b[n].flatten() for n in b]).norm())


# --- the central claim (Eq. 9) --------------------------------------------------------------


@pytest.mark.parametrize("build", [fedhet_mlp, tiny_resnet, fedhet_resnet20])
def test_fedtan_average_equals_centralized_gradient(build):
    model = build()
    batches = non_iid_batches(build, [6, 9, 4])
    result = synchronized_gradients(model, batches, shares(batches), mode="fedtan")
    average = weighted_average(result.gradients, shares(batches))
    assert relative_error(average, centralized_gradients(model, batches)) < 1e-5


@pytest.mark.parametrize("build", [fedhet_mlp, tiny_resnet])
def test_local_bn_average_deviates_from_centralized(build):
    model = build()
    batches = non_iid_batches(build, [6, 9, 4])
    result = synchronized_gradients(model, batches, shares(batches), mode="local")
    average = weighted_average(result.gradients, shares(batches))
    assert relative_error(average, centralized_gradients(model, batches)) > 1e-2


def test_unequal_weights_mean_a_weighted_union():
    """p_i not proportional to batch sizes = each client's samples weighted p_i / b_i:
    with p = (1/2, 1/2) and sizes (4, 6), repeating the batches 3 and 2 times is that union."""
    model = tiny_resnet()
    batches = non_iid_batches(tiny_resnet, [4, 6])
    result = synchronized_gradients(model, batches, [5.0, 5.0], mode="fedtan")
    replicated = [batches[0]] * 3 + [batches[1]] * 2
    average = weighted_average(result.gradients, [0.5, 0.5])
    assert relative_error(average, centralized_gradients(model, replicated)) < 1e-5
    union_stats = union_statistics(model, replicated)
    for stats, (mean, var) in zip(result.statistics, union_stats.values(), strict=True):
        torch.testing.assert_close(stats.mean, mean)
        torch.testing.assert_close(stats.var, var)


# --- per-client gradients against a literal Algorithm 2 + 3 ----------------------------------


def algorithm_3_reference(model: nn.Sequential, batches, p: list[float], aggregate: bool):
    """Linear-BN-ReLU-Linear by the paper's steps: Eq. 39-40 forward, Eq. 41 (if `aggregate`)
    and Eq. 62 (dY = dY_direct + dmean / n + dvar * 2 (Y - mean) / n) backward."""
    lin1, bn, _, lin2 = model
    hidden = [F.linear(x, lin1.weight, lin1.bias).detach() for x, _ in batches]
    mean = sum(pi * h.mean(0) for pi, h in zip(p, hidden, strict=True))
    var = sum(pi * ((h - mean) ** 2).mean(0) for pi, h in zip(p, hidden, strict=True))
    top = [bn.weight, bn.bias, lin2.weight, lin2.bias]
    local = []
    for h, (_, y) in zip(hidden, batches, strict=True):
        h = h.clone().requires_grad_()
        mean_i, var_i = mean.clone().requires_grad_(), var.clone().requires_grad_()
        z = torch.relu(bn.weight * (h - mean_i) / torch.sqrt(var_i + bn.eps) + bn.bias)
        loss = F.cross_entropy(F.linear(z, lin2.weight, lin2.bias), y)
        local.append(torch.autograd.grad(loss, [h, mean_i, var_i, *top]))
    grad_mean = sum(pi * g[1] for pi, g in zip(p, local, strict=True))
    grad_var = sum(pi * g[2] for pi, g in zip(p, local, strict=True))
    clients = []
    for h, (x, _), g in zip(hidden, batches, local, strict=True):
        d_mean, d_var = (grad_mean, grad_var) if aggregate else (g[1], g[2])
        d_h = g[0] + d_mean / len(h) + d_var * 2 * (h - mean) / len(h)
        clients.append(
            {
                "0.weight": d_h.T @ x,
                "0.bias": d_h.sum(0),
                "1.weight": g[3],
                "1.bias": g[4],
                "3.weight": g[5],
                "3.bias": g[6],
            }
        )
    return clients


@pytest.mark.parametrize("mode", ["fedtan", "forward_only"])
def test_client_gradients_follow_algorithms_2_and_3(mode):
    model = plain_mlp()
    batches = non_iid_batches(plain_mlp, [5, 8, 3])
    p = [0.2, 0.5, 0.3]  # not the batch shares: the protocol is defined for any p
    result = synchronized_gradients(model, batches, p, mode=mode)
    expected = algorithm_3_reference(model, batches, p, aggregate=mode == "fedtan")
    for got, want in zip(result.gradients, expected, strict=True):
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=1e-10, atol=1e-12)


def test_forward_only_differs_from_fedtan_in_gradients_not_losses():
    model = tiny_resnet()
    batches = non_iid_batches(tiny_resnet, [6, 9, 4])
    fedtan = synchronized_gradients(copy.deepcopy(model), batches, shares(batches), mode="fedtan")
    forward = synchronized_gradients(
        copy.deepcopy(model), batches, shares(batches), mode="forward_only"
    )
    assert forward.losses == fedtan.losses
    for got, want in zip(forward.gradients, fedtan.gradients, strict=True):
        # above the last BN layer only the forward matters; below it the backward differs
        torch.testing.assert_close(got["head.weight"], want["head.weight"])
        assert relative_error(got, want) > 1e-2


# --- statistics, running statistics, model state -------------------------------------------


def union_statistics(model: nn.Module, batches) -> dict[str, tuple[Tensor, Tensor]]:
    """Mean and biased variance of every BN layer's input in a plain union-batch forward."""
    reference = copy.deepcopy(model)
    stats: dict[str, tuple[Tensor, Tensor]] = {}

    def record(name):
        def hook(_, inputs):
            dims = [0, *range(2, inputs[0].dim())]
            stats[name] = (inputs[0].mean(dims), inputs[0].var(dims, unbiased=False))

        return hook

    for name, layer in reference.named_modules():
        if layer in bn_layers(reference):
            layer.register_forward_pre_hook(record(name))
    with torch.no_grad():
        reference(torch.cat([x for x, _ in batches]))
    return stats


@pytest.mark.parametrize("build", [fedhet_mlp, tiny_resnet])
def test_global_statistics_are_the_union_batch_statistics(build):
    model = build()
    batches = non_iid_batches(build, [6, 9, 4])
    result = synchronized_gradients(model, batches, shares(batches), mode="fedtan")
    expected = union_statistics(model, batches)
    assert [s.name for s in result.statistics] == list(expected)
    for stats in result.statistics:
        mean, var = expected[stats.name]
        torch.testing.assert_close(stats.mean, mean, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(stats.var, var, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("mode", ["fedtan", "forward_only"])
def test_running_statistics_match_torch_on_the_union_batch(mode, momentum):
    model = tiny_resnet()
    for layer in bn_layers(model):
        layer.momentum = momentum
    batches = non_iid_batches(tiny_resnet, [6, 9, 4])
    reference = copy.deepcopy(model)
    with torch.no_grad():
        reference(torch.cat([x for x, _ in batches]))  # torch's own train-mode update
    synchronized_gradients(model, batches, shares(batches), mode=mode)
    for got, want in zip(bn_layers(model), bn_layers(reference), strict=True):
        torch.testing.assert_close(got.running_mean, want.running_mean)
        torch.testing.assert_close(got.running_var, want.running_var)
        assert int(got.num_batches_tracked) == int(want.num_batches_tracked) == 1


def test_local_mode_leaves_running_statistics_untouched():
    model = tiny_resnet()
    before = copy.deepcopy(model.state_dict())
    batches = non_iid_batches(tiny_resnet, [6, 9, 4])
    result = synchronized_gradients(model, batches, shares(batches), mode="local")
    assert result.statistics == []
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def assert_plain_model(model: nn.Module, snapshot: nn.Module, batches) -> None:
    for (name, param), (_, original) in zip(
        model.named_parameters(), snapshot.named_parameters(), strict=True
    ):
        assert torch.equal(param, original), name
        assert param.grad is None, name
    for layer in bn_layers(model):
        assert "forward" not in vars(layer)
        assert not layer._forward_hooks and not layer._forward_pre_hooks
    x = torch.cat([x for x, _ in batches])
    assert torch.equal(model(x), snapshot(x))  # train mode: plain BN with batch statistics


def test_model_parameters_unchanged_and_bn_plain_afterwards():
    model = tiny_resnet()
    snapshot = copy.deepcopy(model)
    batches = non_iid_batches(tiny_resnet, [6, 9, 4])
    for mode in ["fedtan", "forward_only", "local"]:
        synchronized_gradients(model, batches, shares(batches), mode=mode)
        assert_plain_model(model, snapshot, batches)


def test_bn_restored_when_the_loss_fails():
    model = tiny_resnet()
    snapshot = copy.deepcopy(model)
    batches = non_iid_batches(tiny_resnet, [6, 9, 4])

    def failing_loss(outputs, targets):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        synchronized_gradients(model, batches, shares(batches), failing_loss)
    assert_plain_model(model, snapshot, batches)


def test_frozen_bn_layers_are_not_synchronized():
    """A BN layer in eval mode normalizes with running statistics (FedTAN-II): no exchange."""
    model = tiny_resnet()
    model.stem[1].eval()
    batches = non_iid_batches(tiny_resnet, [6, 9, 4])
    result = synchronized_gradients(model, batches, shares(batches), mode="fedtan")
    assert [s.name for s in result.statistics] == ["bn_a", "bn_b", "down.1", "down.5"]
    assert result.communication["bn_layers"] == 4
    average = weighted_average(result.gradients, shares(batches))
    assert relative_error(average, centralized_gradients(model, batches)) < 1e-5


def test_repeated_calls_are_bitwise_identical():
    model = tiny_resnet()
    batches = non_iid_batches(tiny_resnet, [6, 9, 4])
    first = synchronized_gradients(copy.deepcopy(model), batches, shares(batches))
    second = synchronized_gradients(copy.deepcopy(model), batches, shares(batches))
    assert first.losses == second.losses
    for a, b in zip(first.gradients, second.gradients, strict=True):
        assert all(torch.equal(a[n], b[n]) for n in a)


# --- communication -------------------------------------------------------------------------


def test_communication_cost_counts():
    model = fedhet_mlp()  # one BatchNorm1d(30)
    assert communication_cost(model, "fedtan") == {
        "bn_layers": 1,
        "values_per_layer": [120],
        "values": 120,
        "extra_rounds": 3,
        "rounds_per_iteration": 4,
    }
    assert communication_cost(model, "forward_only")["values"] == 60
    assert communication_cost(model, "forward_only")["extra_rounds"] == 2
    assert communication_cost(model, "local")["values"] == 0
    assert communication_cost(model, "local")["rounds_per_iteration"] == 1
    resnet = fedhet_resnet20()
    layers = bn_layers(resnet)
    cost = communication_cost(resnet, "fedtan")
    assert cost["extra_rounds"] == 3 * len(layers)
    assert cost["rounds_per_iteration"] == 3 * len(layers) + 1  # the paper's 3L + 1
    assert cost["values"] == 4 * sum(layer.num_features for layer in layers)


@pytest.mark.parametrize("mode", ["fedtan", "forward_only", "local"])
def test_step_reports_the_static_communication_cost(mode):
    model = tiny_resnet()
    batches = non_iid_batches(tiny_resnet, [3, 4])
    result = synchronized_gradients(model, batches, shares(batches), mode=mode)
    assert result.communication == communication_cost(model, mode)


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("weights", "mode"),
    [
        ([1.0], "fedtan"),
        ([1.0, 0.0], "fedtan"),
        ([1.0, float("nan")], "fedtan"),
        ([1.0, 1.0], "fedbn"),
    ],
)
def test_bad_arguments_raise_input_error(weights, mode):
    model = plain_mlp()
    batches = non_iid_batches(plain_mlp, [3, 4])
    with pytest.raises(InputError):
        synchronized_gradients(model, batches, weights, mode=mode)


def test_active_dropout_is_rejected():
    model = nn.Sequential(plain_mlp(), nn.Dropout(0.5))
    batches = non_iid_batches(plain_mlp, [3, 4])
    with pytest.raises(InputError, match="dropout"):
        synchronized_gradients(model, batches, [1.0, 1.0])


class DataDependentBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.BatchNorm1d(5), nn.BatchNorm1d(5)

    def forward(self, x: Tensor) -> Tensor:
        return self.second(self.first(x)) if x[0, 0] > 0 else self.second(x)


def test_data_dependent_bn_sequence_raises_run_error():
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x[:, 0] = 1.0
    batches = [(x, torch.zeros(4, dtype=torch.long)), (-x, torch.zeros(4, dtype=torch.long))]
    with pytest.raises(RunError, match="order"):
        synchronized_gradients(DataDependentBranch().double(), batches, [1.0, 1.0])
