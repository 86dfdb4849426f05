"""The clients' own models and states of every personalized method are part of the run (issue
48): with 200 tiny clients, a run stopped after round 2 and extended to 3 rounds, and a run
resumed from its round-2 checkpoint, each end bit for bit as the 3-round run straight through;
and the clients' states are stored compactly, as one table stacked over the clients (a fixed
number of arrays whatever the number of clients) and, in checkpoints, as deltas of the clients
a round touched."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from fedhet.core.spec import Spec, parse_spec
from fedhet.core.store import ArtifactStore, arrays
from fedhet.engine.loop import Engine
from fedhet.engine.run_format import CONTINUATION
from fedhet.execution.planning import runs_of
from fedhet.execution.results import execute

CLIENTS, PER_ROUND = 200, 20
METHODS = [
    {"name": "fedper"},
    {"name": "lgfedavg"},
    {"name": "fedrep"},
    {"name": "fedbabu", "finetune_steps": 2},
    {"name": "fedrod"},
    {"name": "finetune", "finetune_steps": 2},
    {"name": "ditto"},
    {"name": "pfedme"},
    {"name": "apfl"},
    {"name": "perfedavg"},
]
# Their clients keep nothing: each personal model is derived from the global one when it is
# evaluated (fine-tuning, Per-FedAvg's one-step adaptation), the same whenever it is asked
STATELESS = {"fedbabu", "finetune", "perfedavg"}


def spec_of(algorithm: dict, rounds: int) -> Spec:
    return parse_spec(
        {
            "name": "pfl-state",
            "seed": 5,
            "data": {"dataset": "digits"},
            "partition": {"scheme": "dirichlet", "clients": CLIENTS, "alpha": 0.3},
            "model": {"arch": "mlp", "hidden": [8]},
            "federation": {
                "rounds": rounds, "clients_per_round": PER_ROUND, "batch_size": 8, "lr": 0.05,
                "local_steps": 2,
            },
            "algorithm": algorithm,
            "runtime": {"threads": 1, "progress": False, "device": "cpu", "checkpoint_every": 1},
        }
    )  # fmt: skip


def train(spec: Spec, store: ArtifactStore) -> zarr.Group:
    (run,) = runs_of(spec)
    return execute(run, store)


def stored(group: zarr.Group) -> dict[str, bytes]:
    """Every array of a train artifact but the wall times, as stored bytes."""
    return {
        name: np.asarray(array[...]).tobytes()
        for name, array in arrays(group)
        if not name.endswith("wall_time")
    }


@pytest.mark.parametrize("algorithm", METHODS, ids=lambda a: a["name"])
def test_a_stopped_and_extended_run_equals_the_run_straight_through(tmp_path, algorithm):
    extended, scratch = ArtifactStore(tmp_path / "extended"), ArtifactStore(tmp_path / "scratch")
    shorter = train(spec_of(algorithm, 2), extended)
    longer = train(spec_of(algorithm, 3), extended)
    assert longer.attrs["extends"]["rounds"] == 2  # it went on from the stored 2-round run
    straight = train(spec_of(algorithm, 3), scratch)
    ours, reference = stored(longer), stored(straight)
    assert ours.keys() == reference.keys() and "model/clients/ids" in ours
    assert [name for name in reference if ours[name] != reference[name]] == []
    # compact: one table, each tensor name one array of values and one of holders
    for table in (shorter["model/clients"], shorter[f"{CONTINUATION}/clients"]):
        names = [name for name, _ in arrays(table)]
        values = [n for n in names if n.startswith("values/")]
        assert len(names) == 1 + 2 * len(values)
        assert bool(values) == (algorithm["name"] not in STATELESS)
        held = set(table["ids"][:].tolist())
        assert len(held) <= CLIENTS and all(table[n].shape[0] <= len(held) for n in values)


@pytest.mark.parametrize("algorithm", METHODS, ids=lambda a: a["name"])
def test_a_run_resumed_from_its_checkpoint_equals_the_run_straight_through(tmp_path, algorithm):
    spec = spec_of(algorithm, 3)
    straight = Engine.from_spec(spec, tmp_path / "straight").run()
    first = Engine.from_spec(spec, tmp_path / "resumed")
    state = first.initial_state()
    for rnd in range(2):
        first.run_round(rnd, state)
        state.round = rnd + 1
        first.checkpoints.save(state)
    deltas = sorted(p.name for p in (tmp_path / "resumed").glob("clients-*.zarr"))
    if algorithm["name"] not in STATELESS:  # round 2's delta: only the clients it touched
        assert len(deltas) == 2
        touched = zarr.open_group(tmp_path / "resumed" / deltas[-1], mode="r")["clients/ids"]
        assert 0 < touched.shape[0] <= PER_ROUND
    resumed_engine = Engine.from_spec(spec, tmp_path / "resumed")
    start = resumed_engine.initial_state()
    assert start.round == 2 and start.client_states.keys() == state.client_states.keys()
    resumed = resumed_engine.run(start)
    assert _same(resumed.global_state, straight.global_state)
    assert resumed.client_states.keys() == straight.client_states.keys()
    for cid, own in straight.client_states.items():
        assert _same(resumed.client_states[cid], own), cid
    assert resumed.metrics["test_accuracy"] == straight.metrics["test_accuracy"]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[n].dtype == b[n].dtype and np.array_equal(a[n].numpy(), b[n].numpy()) for n in a
    )
