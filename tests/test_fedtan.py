"""FedTAN, FedTAN-II, FedAvg+Algorithm 2, FedBN and SiloBN in the engine.

The synchronized step's math is tested in test_fedtan_sync.py; here: that the engine-level
first step is that math on the clients' real first batches, FedTAN-II's freeze, what FedBN and
SiloBN keep on the clients, communication accounting, determinism and resume.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.core.errors import InputError
from fedhet.core.rng import torch_generator
from fedhet.core.spec import Spec, parse_spec
from fedhet.data.datasets import load_dataset
from fedhet.data.partition import Partition
from fedhet.data.partition_stage import spec_partition
from fedhet.engine import tensors
from fedhet.engine.local import batch_schedule
from fedhet.engine.loop import Engine, evaluate
from fedhet.engine.run_format import METRICS, RunState
from fedhet.methods.fedtan.algorithms import bn_state_names

torch.set_num_threads(1)

CLIENTS = 4
DIGITS = load_dataset("digits")


def fedtan_spec(
    algorithm: dict, rounds: int = 2, local_steps: int = 3, model: dict | None = None
) -> Spec:
    """Digits, 4 clients owning 3 label-sorted classes each (non-iid), all participating."""
    return parse_spec(
        {
            "data": {"dataset": "digits"},
            "partition": {
                "scheme": "classes",
                "clients": CLIENTS,
                "classes_per_client": 3,
                "shuffle_classes": False,
            },
            "model": model or {"arch": "mlp", "hidden": [12], "norm": "batch"},
            "federation": {
                "rounds": rounds,
                "local_steps": local_steps,
                "batch_size": 16,
                "lr": 0.2,
            },
            "algorithm": algorithm,
            "runtime": {"progress": False, "checkpoint_every": 1},
        }
    )


def equal_sizes(spec: Spec) -> Partition:
    """The spec's partition with every client cut to the smallest one's samples."""
    part = spec_partition(spec)
    size = min(len(idx) for idx in part.client_indices)
    return dataclasses.replace(part, client_indices=[idx[:size] for idx in part.client_indices])


def weights_of(engine: Engine) -> list[float]:
    sizes = np.asarray(engine.setup.sizes, dtype=np.float64)
    return (sizes / sizes.sum()).tolist()


def snapshot(model: nn.Module) -> dict[str, Tensor]:
    return tensors.clone(model.state_dict())


# --- the synchronized first step in the engine -------------------------------------------------


def first_batches(engine: Engine, rnd: int) -> list[tuple[Tensor, Tensor]]:
    """The first batch of every client's round-`rnd` schedule, drawn independently."""
    fed = engine.spec.federation
    out = []
    for client in engine.setup.clients:
        gen = torch_generator(engine.spec.seed, "local", rnd, client.id)
        idx = next(batch_schedule(client.n, fed.batch_size, fed.local_steps, gen))
        out.append((client.x[idx], client.y[idx]))
    return out


def union_gradient(model: nn.Module, batches) -> dict[str, Tensor]:
    """Centralized: one train-mode forward of the union batch, mean loss over the union."""
    reference = copy.deepcopy(model).train()
    x = torch.cat([x for x, _ in batches])
    y = torch.cat([y for _, y in batches])
    named = list(reference.named_parameters())
    grads = torch.autograd.grad(F.cross_entropy(reference(x), y), [p for _, p in named])
    return {n: g for (n, _), g in zip(named, grads, strict=True)}


def applied_gradients(job, model: nn.Module) -> dict[str, Tensor]:
    client_model = copy.deepcopy(model)
    job.first_step(client_model)
    return {n: p.grad for n, p in client_model.named_parameters()}


def weighted_average(gradients: list[dict[str, Tensor]], weights: list[float]) -> dict:
    return {n: sum(w * g[n] for w, g in zip(weights, gradients, strict=True)) for n in gradients[0]}


def relative_error(a: dict[str, Tensor], b: dict[str, Tensor]) -> float:
    diff = torch.cat([(a[n] - b[n]).flatten() for n in b])
    return float(diff.norm() / torch.cat([b[n].flatten() for n in b]).norm())


@pytest.mark.parametrize(
    "model",
    [
        {"arch": "mlp", "hidden": [12, 10], "norm": "batch"},
        {"arch": "simple_cnn", "channels": [3, 4], "fc_width": 8, "norm": "batch"},
    ],
)
def test_first_step_gradients_average_to_the_union_batch_gradient(tmp_path, model):
    """Eq. 9 at engine level: equal client sizes, so p_i is proportional to the batch sizes."""
    spec = fedtan_spec({"name": "fedtan"}, model=model)
    engine = Engine.from_spec(spec, tmp_path, equal_sizes(spec))
    for client in engine.setup.clients:
        client.x = client.x.double()
    global_model = engine.algorithm.build_model().double()
    state = RunState(0, snapshot(global_model), {}, {})
    jobs = engine.make_jobs(0, state, list(range(CLIENTS)))
    weights = weights_of(engine)
    engine.algorithm.synchronized_first_step(0, copy.deepcopy(global_model), jobs, weights)
    for job in jobs:  # the clients' schedules are untouched: they start with the same batch
        fresh = torch_generator(engine.spec.seed, "local", 0, job.client.id)
        assert torch.equal(job.generator.get_state(), fresh.get_state())
    per_client = [applied_gradients(job, global_model) for job in jobs]
    average = weighted_average(per_client, weights)
    batches = first_batches(engine, 0)
    assert relative_error(average, union_gradient(global_model, batches)) < 1e-10
    # plain local BN (FedAvg's first step) on the same batches is visibly off
    local = [union_gradient(global_model, [batch]) for batch in batches]
    local_average = weighted_average(local, weights)
    assert relative_error(local_average, union_gradient(global_model, batches)) > 1e-2


def test_client_update_takes_the_synchronized_step_first(tmp_path):
    """One local step: the client's model is global - lr * its synchronized gradient, and its
    running statistics are torch's train-mode update on the union batch."""
    spec = fedtan_spec({"name": "fedtan"}, local_steps=1)
    engine = Engine.from_spec(spec, tmp_path, equal_sizes(spec))
    algo, state = engine.algorithm, engine.initial_state()
    jobs = engine.make_jobs(0, state, list(range(CLIENTS)))
    engine.model.load_state_dict(state.global_state)
    algo.synchronized_first_step(0, engine.model, jobs, weights_of(engine))
    reference = copy.deepcopy(engine.model)
    reference.load_state_dict(state.global_state)
    with torch.no_grad():
        reference.train()(torch.cat([x for x, _ in first_batches(engine, 0)]))
    for job in jobs:
        gradients = applied_gradients(job, reference)
        engine.model.load_state_dict(state.global_state)
        result = algo.client_update(job)
        for name, grad in gradients.items():
            torch.testing.assert_close(result.state[name], state.global_state[name] - 0.2 * grad)
        for name, buffer in reference.named_buffers():
            torch.testing.assert_close(result.state[name], buffer)


def test_forward_only_exchanges_half_and_fedtan_adds_3L_round_trips(tmp_path):
    model = {"arch": "simple_cnn", "channels": [3, 4], "fc_width": 8, "norm": "batch"}
    metrics = {
        name: Engine.from_spec(fedtan_spec({"name": name}, rounds=1, model=model), tmp_path / name)
        .run()
        .metrics
        for name in ["fedavg", "fedtan", "fedavg_alg2"]
    }
    channels = 3 + 4  # two BatchNorm2d layers
    for name, vectors, extra_rounds in [("fedtan", 4, 6), ("fedavg_alg2", 2, 4)]:
        extra = CLIENTS * vectors * channels * 4  # float32 values, up and down per client
        assert metrics[name]["bytes_up"][0] - metrics["fedavg"]["bytes_up"][0] == extra
        assert metrics[name]["bytes_down"][0] - metrics["fedavg"]["bytes_down"][0] == extra
        assert metrics[name]["comm_rounds"] == [1 + extra_rounds]
    assert metrics["fedavg"]["comm_rounds"] == [1]


# --- FedTAN-II ---------------------------------------------------------------------------------


def test_fedtan_ii_freezes_statistics_after_m_rounds(tmp_path):
    engine = Engine.from_spec(
        fedtan_spec({"name": "fedtan_ii", "sync_rounds": 1}, rounds=3), tmp_path
    )
    algo = engine.algorithm
    stats = bn_state_names(engine.model, parameters=False, statistics=True)
    state = engine.initial_state()
    initial = tensors.clone(state.global_state)
    engine.run_round(0, state)
    after_m = tensors.clone(state.global_state)
    assert all(not torch.equal(after_m[n], initial[n]) for n in stats)
    # a frozen round: each client normalizes with, and returns, exactly the global statistics
    jobs = engine.make_jobs(1, state, list(range(CLIENTS)))
    engine.model.load_state_dict(state.global_state)
    algo.synchronized_first_step(1, engine.model, jobs, weights_of(engine))
    assert all(job.first_step is None for job in jobs)
    for job in jobs:
        engine.model.load_state_dict(state.global_state)
        result = algo.client_update(job)
        assert all(torch.equal(result.state[n], after_m[n]) for n in stats)
    for rnd in (1, 2):
        engine.run_round(rnd, state)
    assert all(torch.equal(state.global_state[n], after_m[n]) for n in stats)
    for name in bn_state_names(engine.model, parameters=True, statistics=False):
        assert not torch.equal(state.global_state[name], after_m[name])  # affine keeps training
    assert state.metrics["comm_rounds"] == [4, 1, 1]  # 3L + 1 with L = 1, then plain FedAvg


def test_fedtan_ii_label_and_lr_after_freezing(tmp_path):
    engine = Engine.from_spec(
        fedtan_spec({"name": "fedtan_ii", "sync_rounds": 1, "frozen_lr_scale": 0.5}, local_steps=1),
        tmp_path,
    )
    assert engine.spec.algorithm.label() == "FedTAN-II (M=1, frozen lr x0.5)"
    state = engine.initial_state()
    engine.run_round(0, state)
    job = engine.make_jobs(1, state, [0])[0]
    engine.model.load_state_dict(state.global_state)
    engine.algorithm.synchronized_first_step(1, engine.model, [job], [1.0])
    result = engine.algorithm.client_update(job)
    # reference: one plain SGD step at lr 0.2 * 0.5 with BN normalizing by running statistics
    reference = copy.deepcopy(engine.model)
    reference.load_state_dict(state.global_state)
    reference.eval()
    first = first_batches(engine, 1)[0]
    F.cross_entropy(reference(first[0]), first[1]).backward()
    for name, param in reference.named_parameters():
        torch.testing.assert_close(result.state[name], param.detach() - 0.1 * param.grad)


# --- FedBN and SiloBN ---------------------------------------------------------------------------


def record_starts(engine: Engine, names: frozenset[str]) -> dict[tuple[int, int], dict]:
    """Spy on local_loss: the local entries each client's model holds at its first step."""
    starts: dict[tuple[int, int], dict] = {}
    original = engine.algorithm.local_loss

    def spy(job, model, x, y):
        key = (job.round, job.client.id)
        if key not in starts:
            state = model.state_dict()
            starts[key] = {n: state[n].clone() for n in names}
        return original(job, model, x, y)

    engine.algorithm.local_loss = spy
    return starts


@pytest.mark.parametrize(("name", "parameters_local"), [("fedbn", True), ("silobn", False)])
def test_bn_state_stays_on_the_clients(tmp_path, name, parameters_local):
    engine = Engine.from_spec(fedtan_spec({"name": name}, rounds=2), tmp_path)
    statistics = bn_state_names(engine.model, parameters=False, statistics=True)
    affine = bn_state_names(engine.model, parameters=True, statistics=False)
    local = statistics | affine if parameters_local else statistics
    starts = record_starts(engine, statistics | affine)
    state = engine.initial_state()
    initial = tensors.clone(state.global_state)
    engine.run_round(0, state)
    global_after_first = tensors.clone(state.global_state)
    clients_after_first = {c: tensors.clone(s) for c, s in state.client_states.items()}
    engine.run_round(1, state)
    for cid in range(CLIENTS):
        assert set(state.client_states[cid]) == local
        for n in local:  # round 2 starts from the client's own round-1 values
            assert torch.equal(starts[1, cid][n], clients_after_first[cid][n]), n
            if "num_batches_tracked" not in n:  # a counter: equal on clients with equal steps
                other = starts[1, (cid + 1) % CLIENTS][n]
                assert not torch.equal(starts[1, cid][n], other), n
            assert torch.equal(state.global_state[n], initial[n]), n  # the server never sees them
        for n in affine - local:  # shared: every client starts from the averaged value
            assert torch.equal(starts[1, cid][n], global_after_first[n]), n
            assert not torch.equal(global_after_first[n], initial[n]), n
    assert set(engine.algorithm.shared(state.global_state)).isdisjoint(local)
    expected_up = CLIENTS * tensors.nbytes(
        {k: v for k, v in state.global_state.items() if k not in local}
    )
    assert state.metrics["bytes_up"] == [expected_up, expected_up]


def test_fedbn_accuracy_is_the_mean_over_the_clients_models(tmp_path):
    engine = Engine.from_spec(fedtan_spec({"name": "fedbn"}, rounds=1), tmp_path)
    state = engine.run()
    accuracies = []
    model = copy.deepcopy(engine.model)
    for cid in range(CLIENTS):
        model.load_state_dict({**state.global_state, **state.client_states[cid]})
        accuracies.append(evaluate(model, DIGITS.test_x, DIGITS.test_y)[0])
    assert len(set(accuracies)) > 1
    assert state.metrics["test_accuracy"] == [float(np.mean(accuracies))]


# --- determinism, resume, errors ---------------------------------------------------------------


def test_fedtan_is_deterministic_and_resumes_exactly(tmp_path):
    straight = Engine.from_spec(fedtan_spec({"name": "fedtan"}, rounds=3), tmp_path / "a").run()
    again = Engine.from_spec(fedtan_spec({"name": "fedtan"}, rounds=3), tmp_path / "b").run()
    interrupted = Engine.from_spec(fedtan_spec({"name": "fedtan"}, rounds=3), tmp_path / "c")
    state = interrupted.initial_state()
    interrupted.run_round(0, state)
    state.round = 1
    interrupted.checkpoints.save(state)
    resumed = Engine.from_spec(fedtan_spec({"name": "fedtan"}, rounds=3), tmp_path / "c").run()
    for other in (again, resumed):
        for name, value in straight.global_state.items():
            assert torch.equal(other.global_state[name], value), name
        for metric in METRICS:
            if metric != "wall_time":
                assert other.metrics[metric] == straight.metrics[metric], metric


@pytest.mark.parametrize("name", ["fedtan", "fedtan_ii", "fedavg_alg2", "fedbn", "silobn"])
def test_bn_algorithms_reject_models_without_batch_norm(name):
    """Refused when the spec is validated (tests/test_validation_gate.py: before any run)."""
    with pytest.raises(InputError, match="model.norm"):
        fedtan_spec({"name": name}, model={"arch": "mlp", "hidden": [8], "norm": "group"})


def test_labels():
    labels = {
        name: parse_spec(
            {"algorithm": {"name": name}, "model": {"norm": "batch"}}
        ).algorithm.label()
        for name in ["fedtan", "fedavg_alg2", "fedtan_ii", "fedbn", "silobn"]
    }
    assert labels == {
        "fedtan": "FedTAN",
        "fedavg_alg2": "FedAvg+Algorithm 2",
        "fedtan_ii": "FedTAN-II",
        "fedbn": "FedBN",
        "silobn": "SiloBN",
    }
