"""Clients without samples: they never train, no run hangs or divides by zero on them, and the
sampling of partitions without empty clients is unchanged.

The partition: dirichlet alpha 0.05 over 20 clients of digits with seed 0 leaves clients 16
and 18 empty (checked below, so a change of the partition code cannot silently make the
tests vacuous).
"""

from __future__ import annotations

import copy
import math
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import pytest
import torch
import yaml
from conftest import CliRunner

from fedhet.core import registry
from fedhet.core.pipeline import RunContext, ensure
from fedhet.core.spec import parse_spec
from fedhet.core.store import ArtifactStore
from fedhet.data.partition_plan import partition_node
from fedhet.engine.local import batch_schedule
from fedhet.engine.loop import Engine, sample_clients, sample_holders
from fedhet.execution.planning import runs_of
from fedhet.execution.results import execute, stored_metrics
from fedhet.reports.evaluation import evaluate_run

torch.set_num_threads(1)
CLIENTS, EMPTY, HELD = 20, [16, 18], 1438  # HELD: digits' training samples, all dealt
BASE = {
    "name": "empty-clients",
    "seed": 0,
    "data": {"dataset": "digits"},
    "partition": {"scheme": "dirichlet", "clients": CLIENTS, "alpha": 0.05},
    "model": {"arch": "mlp", "hidden": [8]},
    "federation": {"rounds": 2, "batch_size": 16, "lr": 0.05, "local_steps": 2},
    "algorithm": {"name": "fedavg"},
    "runtime": {"threads": 1, "progress": False, "device": "cpu"},
}
BN_CNN = {"arch": "simple_cnn", "channels": [2, 4], "fc_width": 8, "norm": "batch"}
# every registered algorithm's smallest sensible config (a new algorithm fails loudly here)
CONFIGS = {
    "fedavg": ({}, {}),
    "fedprox": ({"mu": 0.1}, {}),
    "scaffold": ({}, {}),
    "fednova": ({}, {}),
    "fedadam": ({}, {}),
    "fedyogi": ({}, {}),
    "fedadagrad": ({}, {}),
    "fedavgm": ({}, {}),
    "centralized": ({}, {}),
    "fedimpro": ({}, {}),
    "fedbr": ({"projection_width": 8, "projection_dim": 4, "pseudo": {"size": 8}}, {}),
    "dann": ({"disc_width": 8}, {}),
    "groupdro": ({}, {}),
    "feddf": ({"server_data": "noise", "steps": 3, "patience": None}, {}),
    "moon": ({"projection_width": 8}, {}),
    "local": ({}, {}),
    "feddyn": ({}, {}),
    "mixup": ({}, {}),
    "fedmix": ({}, {}),
    "ditto": ({}, {}),
    "pfedme": ({}, {}),
    "apfl": ({}, {}),
    "perfedavg": ({"variant": "hf"}, {}),
    "fedper": ({}, {}),
    "lgfedavg": ({}, {}),
    "fedrep": ({"head_epochs": 0.2}, {}),
    "fedbabu": ({"finetune_steps": 2}, {}),
    "fedrod": ({}, {}),
    "finetune": ({"finetune_steps": 2}, {}),
    "fedtan": ({}, {"model": BN_CNN}),
    "fedavg_alg2": ({}, {"model": BN_CNN}),
    "fedtan_ii": ({"sync_rounds": 1}, {"model": BN_CNN}),  # round 2 runs frozen
    "fedbn": ({}, {"model": BN_CNN}),
    "silobn": ({}, {"model": BN_CNN}),
    "tct": (
        {
            "stage1": {"rounds": 1},
            "entk": {"subsample": 40, "dtype": "fp32", "chunk": 128},
            "stage2": {"rounds": 1, "local_steps": 2, "lr": 1e-3},
        },
        {},
    ),
}
VHL = {"name": "fedavg", "vhl": {"generator": {"kind": "noise", "per_class": 2}}}


def own_algorithms() -> list[str]:
    """The algorithms of fedhet's own methods: a plug-in installed beside fedhet is its own
    package's to test."""
    configs = registry.configs()
    return [name for name, config in configs.items() if config.__module__.startswith("fedhet.")]


def spec_data(algorithm: dict, **sections) -> dict:
    data = copy.deepcopy(BASE) | sections
    data["algorithm"] = algorithm
    return data


def algorithm_block(name: str) -> tuple[dict, dict]:
    if name == "fedavg+vhl":
        return VHL, {}
    options, sections = CONFIGS[name]
    return {"name": name, **options}, sections


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> ArtifactStore:
    return ArtifactStore(tmp_path_factory.mktemp("empty-clients-store"))


def engine_for(
    store: ArtifactStore, folder: Path, algorithm: str = "fedavg", **federation
) -> tuple[Engine, list[int]]:
    """An Engine on the partition with empty clients; the ids of the clients that trained are
    appended to the returned list as they train."""
    federation = {**BASE["federation"], **federation}
    spec = parse_spec(spec_data({"name": algorithm}, federation=federation))
    engine = Engine.from_spec(spec, folder, ensure(partition_node(spec), RunContext(spec, store)))
    trained: list[int] = []
    finished = engine.algorithm.finished  # every executor's last word on a trained client

    def recording(job, *args):
        trained.append(job.client.id)
        return finished(job, *args)

    engine.algorithm.finished = recording
    return engine, trained


def test_the_partition_has_empty_clients(store):
    engine, _ = engine_for(store, Path("unused"))
    sizes = engine.setup.sizes
    assert [cid for cid, n in enumerate(sizes) if n == 0] == EMPTY
    assert engine.holders == [cid for cid in range(CLIENTS) if cid not in EMPTY]


@pytest.mark.timeout(10)
def test_batch_schedule_of_an_empty_client_raises_instead_of_looping():
    with pytest.raises(ValueError, match="n=0"):
        next(batch_schedule(0, 16, 3, torch.Generator().manual_seed(0)))


def test_sampling_without_empty_clients_is_unchanged():
    for seed in range(3):
        for rnd in range(50):
            for per_round in (1, 4, 10):
                assert sample_holders(seed, rnd, list(range(10)), per_round) == sample_clients(
                    seed, rnd, 10, per_round
                )


def test_rounds_sample_only_clients_holding_samples():
    holders = [cid for cid in range(CLIENTS) if cid not in EMPTY]
    rounds = [sample_holders(0, rnd, holders, 2) for rnd in range(300)]
    assert all(len(set(picked)) == 2 and set(picked) <= set(holders) for picked in rounds)
    assert set().union(*rounds) == set(holders)  # every holder still gets its turn


@pytest.mark.timeout(60)
@pytest.mark.parametrize("per_round", [None, 19, 5])
def test_empty_clients_never_train_and_the_others_do(store, tmp_path, per_round):
    """All clients, more than the holders (19 of 20 with 18 holding data: all 18 train) and a
    few (5 holders a round)."""
    federation = {"rounds": 2, "clients_per_round": per_round}
    engine, trained = engine_for(store, tmp_path, **federation)
    state = engine.run()
    per_round_trained = min(per_round or CLIENTS, CLIENTS - len(EMPTY))
    assert len(trained) == 2 * per_round_trained
    assert not set(trained) & set(EMPTY) and not set(state.client_states) & set(EMPTY)
    for name in ("train_loss", "divergence", "test_accuracy", "test_loss"):
        assert all(math.isfinite(v) for v in state.metrics[name]), name


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", [*own_algorithms(), "fedavg+vhl"])
def test_every_algorithm_trains_on_a_partition_with_empty_clients(store, name):
    algorithm, sections = algorithm_block(name)
    (run,) = runs_of(parse_spec(spec_data(algorithm, **sections)))
    metrics = stored_metrics(execute(run, store))
    last = {metric: values[-1] for metric, values in metrics.items()}
    for metric in ("test_accuracy", "test_loss", "train_loss", "bytes_up", "wall_time"):
        assert math.isfinite(last[metric]), (metric, last)
    assert 0 <= last["test_accuracy"] <= 1


@pytest.mark.parametrize(
    ("federation", "steps"),
    [({"local_steps": None}, math.ceil(HELD / 16)), ({"local_steps": 2}, 2 * (CLIENTS - 2))],
)
def test_a_centralized_round_processes_what_a_federated_round_does(store, federation, steps):
    """All clients take part, so a federated round trains the 18 holders: one epoch of all the
    samples (epochs), or 2 steps each (local_steps); the empty ones add nothing."""
    engine, _ = engine_for(store, Path("unused"), "centralized", **federation)
    (job,) = engine.make_jobs(0, engine.initial_state(), [0])
    assert job.client.n == HELD
    assert engine.algorithm.local_steps(job) == steps


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["fedavg", "tct"])
def test_eval_scores_an_empty_client_as_nan(store, name):
    algorithm, sections = algorithm_block(name)
    (run,) = runs_of(parse_spec(spec_data(algorithm, **sections)))
    per_client = evaluate_run(run, execute(run, store), store)["per_client"]
    assert [cid for cid, accuracy in enumerate(per_client) if math.isnan(accuracy)] == EMPTY
    assert all(0 <= accuracy <= 1 for accuracy in per_client if not math.isnan(accuracy))


def test_every_algorithm_of_fedhet_is_covered():
    assert set(own_algorithms()) == set(CONFIGS)


def test_a_plugin_installed_beside_fedhet_is_not_enumerated(monkeypatch):
    """tests/plugins/fedhet_example registered through its entry point, as pip would."""
    example = EntryPoint("skewavg", "fedhet_example.plugin:METHOD", registry.GROUP)
    installed = [*entry_points(group=registry.GROUP), example]
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "plugins" / "fedhet_example"))
    monkeypatch.setattr(registry, "entry_points", lambda group: installed)
    registry._load.cache_clear()
    try:
        assert "skewavg" in registry.configs()  # registered
        assert "skewavg" not in own_algorithms() and set(own_algorithms()) == set(CONFIGS)
    finally:
        registry._load.cache_clear()  # the next test loads the registry without it


@pytest.mark.timeout(60)
def test_train_and_partition_say_once_which_clients_never_train(fedhet: CliRunner, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_data({"name": "fednova"})))
    note = f"{len(EMPTY)} of {CLIENTS} clients hold no samples and never train"
    trained = fedhet("train", spec, store=tmp_path / "store")
    assert trained.rc == 0, trained.stderr
    assert (trained.stdout + trained.stderr).count(note) == 1
    partition = fedhet("partition", spec, store=tmp_path / "store")
    assert partition.rc == 0 and partition.stdout.count(note) == 1
    full = spec_data({"name": "fednova"}, partition={**BASE["partition"], "min_samples": 1})
    spec.write_text(yaml.safe_dump(full))
    assert "hold no samples" not in fedhet("partition", spec, store=tmp_path / "store").stdout
