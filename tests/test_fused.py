"""fused_sgd: an MLP client's local SGD with hand-derived gradients takes the steps of
autograd and torch.optim.SGD (`local_sgd`), rounded differently in float32."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fedhet.core.spec import parse_spec
from fedhet.data.clients import ClientData
from fedhet.engine.fused import chain_layers, fused_sgd
from fedhet.engine.local import Divergence, batch_schedule, local_sgd
from fedhet.engine.vectorized import linear_chain
from fedhet.models import build_model


def model_of(hidden: list[int], in_shape=(1, 6, 6), classes: int = 5):
    spec = parse_spec({"model": {"arch": "mlp", "hidden": hidden}})
    return build_model(spec.model, in_shape, classes, seed=3)


def client(n: int = 23, in_shape=(1, 6, 6), classes: int = 5) -> ClientData:
    gen = torch.Generator().manual_seed(7)
    return ClientData(0, torch.randn(n, *in_shape, generator=gen), torch.randint(classes, (n,)))


def reference(model, data: ClientData, steps: int, batch: int, lr: float, wd: float):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, weight_decay=wd)
    batches = batch_schedule(data.n, batch, steps, torch.Generator().manual_seed(1))
    stats = local_sgd(
        model,
        data,
        batches,
        optimizer,
        lambda m, x, y: F.cross_entropy(m(x), y),
        lambda m: None,
        lambda m: None,
    )
    return {n: t.detach().clone() for n, t in model.state_dict().items()}, stats


def fused(model, data: ClientData, steps: int, batch: int, lr: float, wd: float):
    chain = chain_layers(model, linear_chain(model, data.x[0]))
    start = {n: t.detach().clone() for n, t in model.state_dict().items()}
    batches = batch_schedule(data.n, batch, steps, torch.Generator().manual_seed(1))
    return fused_sgd(chain, start, data.x, data.y, batches, lr, wd)


@pytest.mark.parametrize("hidden", [[16, 8], [12], []])
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_fused_steps_are_autograd_and_torch_sgd_steps(hidden, weight_decay):
    """Ragged batches (23 samples, batch 5) over several epochs, MLPs of depth 0 to 2."""
    data = client()
    expected, expected_stats = reference(model_of(hidden), data, 13, 5, 0.1, weight_decay)
    state, stats = fused(model_of(hidden), data, 13, 5, 0.1, weight_decay)
    assert state.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(state[name], tensor, rtol=1e-5, atol=1e-6)
    assert stats.steps == expected_stats.steps == 13
    assert math.isclose(stats.mean_loss, expected_stats.mean_loss, rel_tol=1e-5)
    assert math.isclose(stats.first_loss, expected_stats.first_loss, rel_tol=1e-6)


def test_fused_leaves_the_start_state_untouched():
    model, data = model_of([8]), client()
    start = {n: t.detach().clone() for n, t in model.state_dict().items()}
    chain = chain_layers(model, linear_chain(model, data.x[0]))
    kept = {n: t.clone() for n, t in start.items()}
    batches = batch_schedule(data.n, 5, 4, torch.Generator().manual_seed(1))
    state, _ = fused_sgd(chain, start, data.x, data.y, batches, 0.1)
    assert all(torch.equal(start[n], kept[n]) for n in start)
    assert not torch.equal(state["features.hidden1.1.weight"], start["features.hidden1.1.weight"])


def test_fused_diverges_at_the_step_autograd_does():
    data = client()
    with pytest.raises(Divergence) as expected:
        reference(model_of([16]), data, 40, 5, 1e6, 0.0)
    with pytest.raises(Divergence) as got:
        fused(model_of([16]), data, 40, 5, 1e6, 0.0)
    assert got.value.step == expected.value.step
