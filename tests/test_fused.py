"""fused_sgd: an MLP client's local SGD with hand-derived gradients takes the steps of
autograd and torch.optim.SGD (`local_sgd`), rounded differently in float32."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedhet.core.spec import parse_spec
from fedhet.data.clients import ClientData
from fedhet.engine import fused as fused_module
from fedhet.engine.client_step import OneClient, Proximal
from fedhet.engine.cohort_gradients import linear_chain
from fedhet.engine.fused import chain_layers, fused_sgd
from fedhet.engine.local import Divergence, batch_schedule, local_sgd
from fedhet.models import build_model


def model_of(hidden: list[int], in_shape=(1, 6, 6), classes: int = 5):
    spec = parse_spec({"model": {"arch": "mlp", "hidden": hidden}})
    return build_model(spec.model, in_shape, classes, seed=3)


def client(n: int = 23, in_shape=(1, 6, 6), classes: int = 5) -> ClientData:
    gen = torch.Generator().manual_seed(7)
    return ClientData(0, torch.randn(n, *in_shape, generator=gen), torch.randint(classes, (n,)))


def proximal(model, mu: float) -> Proximal:
    """FedProx's term anchored away from the model's start (it pulls from the first step on)."""
    gen = torch.Generator().manual_seed(5)
    anchor = {
        n: p.detach() + 0.1 * torch.randn(p.shape, generator=gen).to(p.device)
        for n, p in model.named_parameters()
    }
    return Proximal(mu, anchor)


def reference(model, data: ClientData, steps: int, batch: int, lr: float, wd: float, mu=0.0):
    """Autograd and torch.optim.SGD, with FedProx's term (mu > 0) as the sequential path runs it."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, weight_decay=wd)
    batches = batch_schedule(data.n, batch, steps, torch.Generator().manual_seed(1))
    one = OneClient(proximal(model, mu), model, {}, lr)
    stats = local_sgd(
        model,
        data,
        batches,
        optimizer,
        lambda m, x, y: one.loss(F.cross_entropy(m(x), y)),
        one.before_step,
        one.after_step,
    )
    return {n: t.detach().clone() for n, t in model.state_dict().items()}, stats


def fused(model, data: ClientData, steps: int, batch: int, lr: float, wd: float, mu=0.0):
    chain = chain_layers(model, linear_chain(model, data.x[0]))
    start = {n: t.detach().clone() for n, t in model.state_dict().items()}
    batches = batch_schedule(data.n, batch, steps, torch.Generator().manual_seed(1))
    return fused_sgd(chain, start, data.x, data.y, batches, lr, wd, proximal(model, mu))


@pytest.mark.parametrize("hidden", [[16, 8], [12], []])
@pytest.mark.parametrize(("weight_decay", "mu"), [(0.0, 0.0), (0.01, 0.0), (0.0, 1.0), (0.01, 0.5)])
def test_fused_steps_are_autograd_and_torch_sgd_steps(hidden, weight_decay, mu):
    """Ragged batches (23 samples, batch 5) over several epochs, MLPs of depth 0 to 2, with
    weight decay and FedProx's proximal term (its value in the losses, its gradient in the
    steps)."""
    data = client()
    expected, expected_stats = reference(model_of(hidden), data, 13, 5, 0.1, weight_decay, mu)
    state, stats = fused(model_of(hidden), data, 13, 5, 0.1, weight_decay, mu)
    assert state.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(state[name], tensor, rtol=1e-5, atol=1e-6)
    assert stats.steps == expected_stats.steps == 13
    assert math.isclose(stats.mean_loss, expected_stats.mean_loss, rel_tol=1e-5)
    assert math.isclose(stats.first_loss, expected_stats.first_loss, rel_tol=1e-6)


def test_fused_leaves_the_start_state_and_the_data_untouched():
    """The steps update the client's copy in place and apply ReLU in place: never to these."""
    model, data = model_of([8]), client()
    start = {n: t.detach().clone() for n, t in model.state_dict().items()}
    chain = chain_layers(model, linear_chain(model, data.x[0]))
    kept = {n: t.clone() for n, t in start.items()}
    kept_x, kept_y = data.x.clone(), data.y.clone()
    batches = batch_schedule(data.n, 5, 4, torch.Generator().manual_seed(1))
    state, _ = fused_sgd(chain, start, data.x, data.y, batches, 0.1)
    assert all(torch.equal(start[n], kept[n]) for n in start)
    assert torch.equal(data.x, kept_x) and torch.equal(data.y, kept_y)
    assert not torch.equal(state["features.hidden1.1.weight"], start["features.hidden1.1.weight"])


def assert_same_steps(model_a, model_b, data: ClientData, steps=13, batch=5, lr=0.1, wd=0.01):
    expected, expected_stats = reference(model_a, data, steps, batch, lr, wd)
    state, stats = fused(model_b, data, steps, batch, lr, wd)
    for name, tensor in expected.items():
        torch.testing.assert_close(state[name], tensor, rtol=1e-5, atol=1e-6)
    assert math.isclose(stats.mean_loss, expected_stats.mean_loss, rel_tol=1e-5)


@pytest.mark.parametrize(
    ("layers", "in_shape"),
    [
        # 2-d samples, no Flatten, a Linear without bias
        (lambda: nn.Sequential(nn.Linear(36, 8), nn.ReLU(), nn.Linear(8, 5, bias=False)), (36,)),
        # a ReLU below the first Linear, applied to the gathered samples
        (lambda: nn.Sequential(nn.Flatten(), nn.ReLU(), nn.Linear(36, 5)), (1, 6, 6)),
    ],
)
def test_hand_built_chains(layers, in_shape):
    data = client(in_shape=in_shape)
    kept_x = data.x.clone()
    torch.manual_seed(0)
    model = layers()
    assert_same_steps(model, copy.deepcopy(model), data)
    assert torch.equal(data.x, kept_x)


def test_groups_of_gathered_samples_take_the_same_steps(monkeypatch):
    """Many epochs of a client gathered a few batches at a time."""
    data = client()
    _, whole = fused(model_of([8]), data, 13, 5, 0.1, 0.0)
    monkeypatch.setattr(fused_module, "GATHERED_SAMPLES", 7)
    assert_same_steps(model_of([8]), model_of([8]), data)
    _, grouped = fused(model_of([8]), data, 13, 5, 0.1, 0.0)
    # not bit for bit: BLAS may round differently as the data's alignment changes
    assert math.isclose(grouped.mean_loss, whole.mean_loss, rel_tol=1e-6)


def test_no_batches_leave_the_start_state():
    model, data = model_of([8]), client()
    start = {n: t.detach().clone() for n, t in model.state_dict().items()}
    chain = chain_layers(model, linear_chain(model, data.x[0]))
    state, stats = fused_sgd(chain, start, data.x, data.y, iter([]), 0.1)
    assert all(torch.equal(state[n], start[n]) for n in start)
    assert (stats.steps, stats.mean_loss, math.isnan(stats.first_loss)) == (0, 0.0, True)


def test_fused_diverges_at_the_step_autograd_does():
    data = client()
    with pytest.raises(Divergence) as expected:
        reference(model_of([16]), data, 40, 5, 1e6, 0.0)
    with pytest.raises(Divergence) as got:
        fused(model_of([16]), data, 40, 5, 1e6, 0.0)
    assert got.value.step == expected.value.step


def test_a_non_finite_sample_diverges_at_its_step(monkeypatch):
    """At the first step (a NaN weight), and at the last step (an infinite sample first drawn
    there), alone or the last of a group."""
    broken = model_of([8])
    with torch.no_grad():
        broken.state_dict()["features.hidden1.1.weight"][0, 0] = math.nan
    with pytest.raises(Divergence) as first:
        fused(broken, client(), 5, 5, 0.1, 0.0)
    assert first.value.step == 0
    data = client()
    last_batch = list(batch_schedule(data.n, 5, 5, torch.Generator().manual_seed(1)))[-1]
    data.x[last_batch[0]] = math.inf
    for gathered in (4096, 13):  # step 4 alone, or the last of a group of steps 2-4
        monkeypatch.setattr(fused_module, "GATHERED_SAMPLES", gathered)
        with pytest.raises(Divergence) as last:
            fused(model_of([8]), data, 5, 5, 0.1, 0.0)
        assert last.value.step == 4
    with pytest.raises(Divergence) as expected:
        reference(model_of([8]), data, 5, 5, 0.1, 0.0)
    assert expected.value.step == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (and FEDHET_TEST_CUDA=1)")
def test_cuda_samples_with_cpu_batches():
    """The batch schedule draws its indices on the CPU; the client's samples may be on a GPU."""
    data = client()
    on_gpu = ClientData(0, data.x.cuda(), data.y.cuda())
    expected, _ = fused(model_of([8]), data, 13, 5, 0.1, 0.01)
    state, _ = fused(model_of([8]).cuda(), on_gpu, 13, 5, 0.1, 0.01)
    reference_state, _ = reference(model_of([8]).cuda(), on_gpu, 13, 5, 0.1, 0.01)
    for name, tensor in expected.items():
        torch.testing.assert_close(state[name].cpu(), tensor, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(reference_state[name].cpu(), tensor, rtol=1e-4, atol=1e-5)
