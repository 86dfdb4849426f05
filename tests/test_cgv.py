"""Client gradient variance (FedImpro Definition 3) against a direct computation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedhet.core.errors import InputError
from fedhet.core.spec import ModelSpec
from fedhet.data.clients import ClientData
from fedhet.metrics.cgv import client_gradient_variance
from fedhet.models import build_model

torch.set_num_threads(1)
SHAPE, CLASSES = (1, 6, 6), 4


def model_with(norm: str = "none", seed: int = 0):
    spec = ModelSpec(arch="simple_cnn", norm=norm, channels=[4, 4], fc_width=8)
    model = build_model(spec, SHAPE, CLASSES, seed)
    if norm == "batch":  # non-trivial running statistics, as after training
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, torch.nn.BatchNorm2d):
                    gen = torch.Generator().manual_seed(1)
                    module.running_mean.uniform_(-0.5, 0.5, generator=gen)
                    module.running_var.uniform_(0.5, 2.0, generator=gen)
    return model


def heterogeneous_clients(sizes=(30, 11, 52), seed: int = 0) -> list[ClientData]:
    """Clients with different sizes, input shifts and label mixes."""
    gen = torch.Generator().manual_seed(seed)
    clients = []
    for cid, n in enumerate(sizes):
        x = torch.randn(n, *SHAPE, generator=gen) + cid
        y = torch.randint(0, cid + 2, (n,), generator=gen)
        clients.append(ClientData(cid, x, y))
    return clients


def direct_cgv(model, clients, weights) -> dict[str, float]:
    """sum_k p_k ||g_k - sum_j p_j g_j||^2 from full-batch gradients, in float64."""
    model.eval()
    names = [n for n, _ in model.named_parameters()]
    grads = []
    for c in clients:
        loss = F.cross_entropy(model(c.x), c.y)
        parts = torch.autograd.grad(loss, list(model.parameters()))
        grads.append({n: g.double() for n, g in zip(names, parts, strict=True)})
    p = torch.tensor(weights, dtype=torch.float64) / sum(weights)

    def variance(selected: list[str]) -> float:
        flat = torch.stack([torch.cat([g[n].reshape(-1) for n in selected]) for g in grads])
        mean = (p[:, None] * flat).sum(0)
        return float((p * ((flat - mean) ** 2).sum(1)).sum())

    return {
        "total": variance(names),
        "features": variance([n for n in names if n.startswith("features.")]),
        "head": variance([n for n in names if n.startswith("head.")]),
    }


@pytest.mark.parametrize("norm", ["none", "batch"])
@pytest.mark.parametrize("batch_size", [1000, 7])
def test_cgv_equals_a_direct_computation(norm, batch_size):
    model, clients = model_with(norm), heterogeneous_clients()
    sizes = [c.n for c in clients]
    got = client_gradient_variance(model, clients, batch_size=batch_size)
    expected = direct_cgv(model, clients, sizes)
    assert got.keys() == expected.keys()
    for key in expected:
        assert got[key] == pytest.approx(expected[key], rel=1e-5), key
    assert expected["total"] > 1e-3


def test_weights_default_to_client_sizes_and_are_normalized():
    model, clients = model_with(), heterogeneous_clients()
    sizes = [c.n for c in clients]
    by_size = client_gradient_variance(model, clients)
    scaled = client_gradient_variance(model, clients, [3 * n for n in sizes])
    assert scaled == pytest.approx(by_size)
    uniform = client_gradient_variance(model, clients, [1, 1, 1])
    expected = direct_cgv(model, clients, [1, 1, 1])["total"]
    assert uniform["total"] == pytest.approx(expected, rel=1e-5)
    assert uniform["total"] != pytest.approx(by_size["total"], rel=1e-3)


def test_groups_split_the_total():
    model, clients = model_with("batch"), heterogeneous_clients()
    default = client_gradient_variance(model, clients)
    assert default["features"] + default["head"] == pytest.approx(default["total"], rel=1e-12)
    names = [n for n, _ in model.named_parameters()]
    low, high = model.split("conv2")
    low_names = [f"features.{n}" for n, _ in low.named_parameters()]
    groups = {"low": low_names, "high": [n for n in names if n not in low_names]}
    split = client_gradient_variance(model, clients, groups=groups)
    assert split["low"] + split["high"] == pytest.approx(split["total"], rel=1e-12)
    assert split["total"] == pytest.approx(default["total"], rel=1e-12)
    assert 0 < split["low"] < default["features"]  # fc1 moved from the low to the high part
    by_prefix = client_gradient_variance(
        model, clients, groups={"conv": ["features.conv1", "features.conv2"], "head": ["head"]}
    )
    assert by_prefix["conv"] == pytest.approx(split["low"], rel=1e-12)


def test_logistic_regression_has_only_a_head_group():
    model = build_model(ModelSpec(arch="mlp", hidden=[]), SHAPE, CLASSES, seed=0)
    clients = heterogeneous_clients()
    result = client_gradient_variance(model, clients)
    assert result.keys() == {"total", "head"}
    assert result["head"] == result["total"] > 0


@pytest.mark.parametrize("norm", ["none", "batch"])
def test_cgv_is_zero_when_every_client_holds_the_same_data(norm):
    model = model_with(norm)
    same = heterogeneous_clients(sizes=(25,))[0]
    clients = [ClientData(cid, same.x.clone(), same.y.clone()) for cid in range(4)]
    result = client_gradient_variance(model, clients, weights=[1, 2, 3, 4])
    assert result == {"total": 0.0, "features": 0.0, "head": 0.0}


def test_a_custom_objective_is_used_and_the_model_mode_is_restored():
    model, clients = model_with("batch"), heterogeneous_clients()
    plain = client_gradient_variance(model.train(), clients)
    assert model.training
    doubled = client_gradient_variance(
        model, clients, loss_fn=lambda m, x, y: 2 * F.cross_entropy(m(x), y)
    )
    assert doubled["total"] == pytest.approx(4 * plain["total"], rel=1e-6)  # ||2 g||^2


@pytest.mark.parametrize(
    ("groups", "fragment"),
    [
        ({"a": ["features"], "b": ["features.conv1"]}, "both"),
        ({"a": ["nope"]}, "names no parameter"),
        ({"total": ["head"]}, "reserved"),
    ],
)
def test_bad_groups_are_input_errors(groups, fragment):
    with pytest.raises(InputError, match=fragment):
        client_gradient_variance(model_with(), heterogeneous_clients(), groups=groups)


def test_bad_weights_are_input_errors():
    with pytest.raises(InputError, match="weights"):
        client_gradient_variance(model_with(), heterogeneous_clients(), weights=[1, 2])
