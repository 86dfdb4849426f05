"""Cross-device scale: 10,000 Fashion-MNIST clients (6 samples each), 100 a round, SCAFFOLD
(a persistent state per client) on the vectorized executor. The run trains, and every
checkpoint writes only the clients touched since the previous one, however many were seen."""

from __future__ import annotations

import pytest
import torch
import zarr

from fedhet.core.spec import parse_spec
from fedhet.data import datasets
from fedhet.data.clients import ClientData
from fedhet.data.partition import make_partition
from fedhet.engine.client_executors import VectorizedExecutor
from fedhet.engine.loop import Checkpoints, Engine
from fedhet.engine.setup import TrainSetup

CLIENTS, PER_ROUND, ROUNDS = 10_000, 100, 5

pytestmark = pytest.mark.skipif(
    not datasets._debian_fashion_mnist_present(), reason="Fashion-MNIST is not installed"
)


def test_ten_thousand_clients_train_and_checkpoints_cost_the_clients_touched(tmp_path):
    spec = parse_spec(
        {
            "data": {"dataset": "fmnist"},
            "partition": {"scheme": "iid", "clients": CLIENTS},
            "model": {"arch": "mlp", "hidden": []},
            "federation": {"rounds": ROUNDS, "clients_per_round": PER_ROUND, "batch_size": 10},
            "algorithm": {"name": "scaffold"},
            "runtime": {"device": "cpu", "progress": False, "clients": "vectorized"},
        }
    )
    ds = datasets.load_dataset("fmnist")
    part = make_partition(spec.partition, ds.train_y.numpy(), ds.num_classes, spec.seed)
    clients = [
        ClientData(cid, ds.train_x[index], ds.train_y[index])
        for cid, index in enumerate(map(torch.from_numpy, part.client_indices))
    ]
    assert len(clients) == CLIENTS and {c.n for c in clients} == {6}
    setup = TrainSetup(spec, ds, clients, torch.device("cpu"))
    trainer = spec.algorithm.trainer_class()(spec.algorithm, setup)
    executor = VectorizedExecutor(trainer, setup.device, print)
    checkpoints = Checkpoints(tmp_path)
    engine = Engine(trainer, setup, checkpoints, 1, executor=executor)
    state = engine.initial_state()
    written: list[int] = []  # clients in each checkpoint's new delta
    for rnd in range(ROUNDS):
        engine.run_round(rnd, state)
        state.round = rnd + 1
        before = set(tmp_path.glob("clients-*"))
        checkpoints.save(state)
        (delta,) = set(tmp_path.glob("clients-*")) - before
        written.append(zarr.open_group(delta, mode="r")["clients/ids"].shape[0])
    assert executor.ran == {"vectorized"}
    assert len(state.client_states) > (ROUNDS - 1) * PER_ROUND  # clients seen keep growing
    assert written == [PER_ROUND] * ROUNDS  # what each checkpoint writes does not
    resumed = Checkpoints(tmp_path).latest()
    assert resumed.round == ROUNDS and resumed.client_states.keys() == state.client_states.keys()
    assert state.metrics["test_accuracy"][-1] > 0.5
