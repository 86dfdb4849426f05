"""`runtime.clients`: the vectorized and fused executors in whole runs. It is never in a key,
the executor that ran is recorded in the train artifact's environment and reusing a run trained
by another executor is announced; a full run lands where the seeds' spread of sequential runs
lies; what cannot run vectorized or fused runs sequentially, said in one line; auto picks the
fastest that applies."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from fedhet.core.spec import parse_spec
from fedhet.core.store import ArtifactStore
from fedhet.engine.client_executors import auto_choice, executor_name
from fedhet.engine.client_step import Proximal
from fedhet.engine.loop import Engine
from fedhet.engine.run_format import RunState
from fedhet.execution.planning import runs_of
from fedhet.execution.results import execute
from fedhet.methods.fedprox.algorithm import FedProx

SPEC = {
    "name": "executors",
    "data": {"dataset": "digits"},
    "partition": {"scheme": "dirichlet", "clients": 20, "alpha": 0.3},
    "model": {"arch": "mlp", "hidden": [32]},
    "federation": {"rounds": 8, "clients_per_round": 8, "batch_size": 10, "lr": 0.05},
    "eval": {"every": 4},
    "runtime": {"threads": 1, "progress": False, "device": "cpu"},
}


def run_of(clients: str, **changes) -> object:
    spec = copy.deepcopy(SPEC)
    spec["runtime"]["clients"] = clients
    for field, value in changes.items():
        spec[field] = value
    (run,) = runs_of(parse_spec(spec))
    return run


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_executor_is_recorded_never_keyed_and_reuse_across_executors_announced(
    tmp_path, one_thread, capsys
):
    runs = {clients: run_of(clients) for clients in ("sequential", "vectorized", "fused", "auto")}
    assert len({run.node.key for run in runs.values()}) == 1
    store = ArtifactStore(tmp_path)
    trained = execute(runs["vectorized"], store)
    assert trained.attrs["environment"]["clients"] == "vectorized"
    partition = runs["vectorized"].node.upstream["partition"].key
    assert "clients" not in store.open("partition", partition).attrs["environment"]
    capsys.readouterr()
    execute(runs["sequential"], store)
    key = runs["sequential"].node.key
    announced = [line for line in capsys.readouterr().err.splitlines() if "another" in line]
    assert announced == [
        f"train {key[:12]}: reusing the stored artifact, computed under another environment: "
        "vectorized clients (now sequential clients)"
    ]
    execute(runs["auto"], store)  # auto accepts either executor
    assert not [line for line in capsys.readouterr().err.splitlines() if "another" in line]


def final_accuracy(clients: str, seed: int, folder) -> float:
    group = execute(run_of(clients, seed=seed), ArtifactStore(folder / clients))  # same keys
    assert group.attrs["environment"]["clients"] == clients
    return group.attrs["summary"]["final"]


def test_vectorized_and_fused_runs_land_within_the_seed_spread_of_sequential_runs(
    tmp_path, one_thread
):
    """Vectorized, fused and sequential runs of one seed take the same steps, rounded
    differently: their gap must stay far below what changing the seed does. For every seed the
    paired gap is at most the sequential runs' seed spread (max - min over the seeds), and each
    executor's mean lies within that spread."""
    seeds = (0, 1, 2)
    sequential = np.array([final_accuracy("sequential", s, tmp_path) for s in seeds])
    spread = sequential.max() - sequential.min()
    assert spread > 0
    for clients in ("vectorized", "fused"):
        other = np.array([final_accuracy(clients, s, tmp_path) for s in seeds])
        assert np.abs(other - sequential).max() <= spread
        assert sequential.min() <= other.mean() <= sequential.max()


TWO_ROUNDS = {**SPEC["federation"], "rounds": 2}


@pytest.mark.parametrize(
    ("clients", "changes", "reason"),
    [
        (
            "vectorized",
            {"algorithm": {"name": "fedimpro"}},
            "fedimpro trains its clients its own way",
        ),
        (
            "vectorized",
            {
                "model": {"arch": "mlp", "hidden": [16], "norm": "batch"},
                "partition": {"scheme": "iid", "clients": 20},
                # no batch of one sample
                "federation": {"rounds": 3, "clients_per_round": 8, "batch_size": 32},
            },
            "BatchNorm",
        ),
        (
            "fused",
            {"algorithm": {"name": "scaffold"}, "federation": TWO_ROUNDS},
            "scaffold's client step changes local SGD",
        ),
        (
            "fused",
            {"model": {"arch": "simple_cnn"}, "federation": TWO_ROUNDS},
            "not a chain of Linear, ReLU and Flatten",
        ),
        (
            "fused",
            {"algorithm": {"name": "fedavg", "local_momentum": 0.5}, "federation": TWO_ROUNDS},
            "momentum",
        ),
    ],
)
def test_what_cannot_run_vectorized_or_fused_runs_sequentially_said_in_one_line(
    tmp_path, one_thread, capsys, clients, changes, reason
):
    group = execute(run_of(clients, **changes), ArtifactStore(tmp_path))
    said = [line for line in capsys.readouterr().err.splitlines() if "clients:" in line]
    assert len(said) == 1 and said[0].startswith(f"clients: training sequentially, not {clients}")
    assert reason in said[0]
    assert group.attrs["environment"]["clients"] == "sequential"


@pytest.mark.parametrize(
    ("changes", "choice"),
    [
        ({}, "fused"),
        ({"algorithm": {"name": "fedprox", "mu": 0.1}}, "fused"),
        ({"algorithm": {"name": "scaffold"}}, "vectorized"),
        ({"model": {"arch": "simple_cnn"}}, "sequential"),
    ],
)
def test_auto_picks_fused_then_vectorized_then_sequential(tmp_path, changes, choice):
    """Fused where the MLP's client step is plain SGD or FedProx's proximal term; vectorized for
    other client steps and models without convolutions; sequential for convolutions."""
    spec = parse_spec({**SPEC, **changes})
    trainer = Engine.from_spec(spec, tmp_path).algorithm
    assert auto_choice(trainer, trainer.build_model(), torch.device("cpu")) == choice


def test_auto_runs_the_default_spec_fused(tmp_path, one_thread):
    spec = copy.deepcopy(SPEC)
    assert "clients" not in spec["runtime"]
    spec["federation"]["rounds"] = 2
    (run,) = runs_of(parse_spec(spec))
    assert execute(run, ArtifactStore(tmp_path)).attrs["environment"]["clients"] == "fused"


def rounds_of(clients: str, folder, rounds: int = 3, trainer=None) -> tuple[Engine, RunState]:
    spec = parse_spec(
        {
            **SPEC,
            "algorithm": {"name": "fedprox", "mu": 1.0},
            "runtime": {**SPEC["runtime"], "clients": clients},
        }
    )
    engine = Engine.from_spec(spec, folder / clients, trainer=trainer, say=print)
    state = engine.initial_state()
    for rnd in range(rounds):
        engine.run_round(rnd, state)
    return engine, state


def test_fedprox_runs_fused_the_sequential_rounds(tmp_path, one_thread):
    """Three rounds of FedProx (mu 1): the global models and the clients' recorded losses agree
    to float32 rounding."""
    fused, fused_state = rounds_of("fused", tmp_path)
    sequential, sequential_state = rounds_of("sequential", tmp_path)
    assert executor_name(fused.executor) == "fused"
    for name, tensor in sequential_state.global_state.items():
        torch.testing.assert_close(fused_state.global_state[name], tensor, rtol=1e-5, atol=1e-6)
    loss = "train_loss"
    np.testing.assert_allclose(fused_state.metrics[loss], sequential_state.metrics[loss], 1e-5)


def test_a_step_other_than_the_one_declared_runs_sequentially(tmp_path, one_thread, capsys):
    """A trainer declaring a proximal step whose step also corrects the gradients."""

    class Corrected(Proximal):
        def correct(self, grads, extras, params):
            return {n: 2 * g for n, g in grads.items()}

    class Declares(FedProx):
        def client_step(self, round, global_state, server_state) -> Proximal:
            return Corrected(self.config.mu, global_state)

    engine, _ = rounds_of("fused", tmp_path, rounds=2, trainer=Declares)
    said = [line for line in capsys.readouterr().out.splitlines() if "clients:" in line]
    assert said == [
        "clients: training sequentially, not fused (fedprox's client step changes local SGD)"
    ]
    assert executor_name(engine.executor) == "sequential"
