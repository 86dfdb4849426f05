"""Cross-device scale: 10,000 Fashion-MNIST clients (6 samples each), 100 a round, SCAFFOLD
(a persistent state per client) on the vectorized executor. The run trains, and every
checkpoint writes only the clients touched since the previous one, however many were seen."""

from __future__ import annotations

import pytest
import zarr

from fedhet.core.spec import parse_spec
from fedhet.data import torchvision_sets
from fedhet.engine.loop import Checkpoints, Engine

CLIENTS, PER_ROUND, ROUNDS = 10_000, 100, 5

pytestmark = pytest.mark.skipif(
    not torchvision_sets.debian_fashion_mnist_present(), reason="Fashion-MNIST is not installed"
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
    engine = Engine.from_spec(spec, tmp_path)
    clients, checkpoints, executor = engine.setup.clients, engine.checkpoints, engine.executor
    assert len(clients) == CLIENTS and {c.n for c in clients} == {6}
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
