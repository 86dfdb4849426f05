"""More rounds continue a stored run: `federation.rounds=7` after a stored 6-round run trains
round 7 only, and gives the 7-round run from scratch bit for bit (issue 24)."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from conftest import TINY_SPEC, write_spec

from fedhet.core.sealed import arrays
from fedhet.core.spec import load_spec, parse_spec
from fedhet.core.store import ArtifactStore
from fedhet.execution.planning import runs_of

BN_MLP = {"arch": "mlp", "hidden": [12], "norm": "batch"}


def spec_file(tmp_path, algorithm: dict, **sections):
    raw = {
        **TINY_SPEC,
        "partition": {"scheme": "dirichlet", "clients": 6, "alpha": 0.5},
        "federation": {"rounds": 6, "clients_per_round": 3, "batch_size": 32, "lr": 0.05},
        "algorithm": algorithm,
        "eval": {"every": 5},  # round 6 is evaluated only as a 6-round run's last round
        "runtime": {"threads": 1, "progress": False, "device": "cpu"},
        **sections,
    }
    return write_spec(tmp_path / f"{algorithm['name']}.yaml", raw)


def train_key(spec_path, *overrides: str) -> str:
    (run,) = runs_of(load_spec(spec_path, overrides=list(overrides)))
    return run.node.key


def stored_arrays(group: zarr.Group) -> dict[str, np.ndarray]:
    """Every array of a train artifact but the wall times, as stored."""
    return {
        name: np.asarray(array[...])
        for name, array in arrays(group)
        if not name.endswith("wall_time")
    }


@pytest.mark.parametrize(
    ("algorithm", "model", "data"),
    [
        ({"name": "fedavg"}, None, None),
        ({"name": "scaffold"}, None, None),
        ({"name": "fedbn"}, BN_MLP, None),
        ({"name": "fedavg"}, None, {"dataset": "digits", "validation": 0.2}),  # best by val
    ],
)
def test_more_rounds_extend_a_stored_run_to_the_run_from_scratch(
    tmp_path, fedhet, algorithm, model, data
):
    sections = {"model": model} if model else {}
    spec = spec_file(tmp_path, algorithm, **sections, **({"data": data} if data else {}))
    extended, scratch = tmp_path / "extended", tmp_path / "scratch"
    assert fedhet("train", spec, "--store", extended).rc == 0
    short_key, key = train_key(spec), train_key(spec, "federation.rounds=7")

    planned = fedhet("plan", spec, "federation.rounds=7", "--store", extended, "--format", "csv")
    assert planned.rc == 0
    assert f"extends {short_key[:10]} from round 6" in planned.stdout
    trained = fedhet("train", spec, "federation.rounds=7", "--store", extended)
    assert trained.rc == 0, trained.stderr
    lines = [line for line in trained.stderr.splitlines() if "extends" in line]
    assert lines == [
        f"train {key[:12]}: extends {short_key[:10]} from round 6 (the stored run of the same "
        "config with 6 rounds)"
    ]
    assert fedhet("train", spec, "federation.rounds=7", "--store", scratch).rc == 0

    ours = ArtifactStore(extended).open("train", key)
    reference = ArtifactStore(scratch).open("train", key)
    assert ours.attrs["extends"] == {"key": short_key, "rounds": 6}
    assert "extends" not in reference.attrs
    expected = stored_arrays(reference)
    found = stored_arrays(ours)
    assert found.keys() == expected.keys()
    assert any(name.startswith("continuation/clients/") for name in expected)
    for name, values in expected.items():
        assert found[name].tobytes() == values.tobytes(), name
    # the 6-round run scored its last round, the longer run did not: the metrics differ there
    short = ArtifactStore(extended).open("train", short_key)["metrics"]["test_accuracy"][:]
    assert np.isfinite(short[5]) and np.isnan(expected["metrics/test_accuracy"][5])


def test_the_continuation_is_the_state_after_the_rounds_without_the_last_evaluation(
    tmp_path, fedhet
):
    spec = spec_file(tmp_path, {"name": "fedavg"})
    assert fedhet("train", spec, "--store", tmp_path).rc == 0
    artifact = ArtifactStore(tmp_path).open("train", train_key(spec))
    continuation = artifact["continuation"]
    accuracy = continuation["metrics"]["test_accuracy"][:]
    assert continuation.attrs["round"] == 6
    np.testing.assert_array_equal(np.isnan(accuracy), [1, 1, 1, 1, 0, 1])
    assert continuation.attrs["best_accuracy"] == accuracy[4]
    final, kept = artifact["model"]["final"], continuation["global"]
    for name, values in final.arrays():
        assert np.asarray(kept[name][...]).tobytes() == np.asarray(values[...]).tobytes()


def test_a_method_whose_rounds_depend_on_the_total_is_not_extended():
    raw = {**TINY_SPEC, "model": {"arch": "mlp", "hidden": [16]}}
    fraction = parse_spec({**raw, "algorithm": {"name": "fedimpro", "ramp": 0.5}})
    fixed = parse_spec({**raw, "algorithm": {"name": "fedimpro", "ramp_rounds": 3}})
    fedavg = parse_spec({**raw, "algorithm": {"name": "fedavg"}})
    assert not fraction.algorithm.extendable(fraction, 1)
    assert fixed.algorithm.extendable(fixed, 1)
    assert fedavg.algorithm.extendable(fedavg, 1)
