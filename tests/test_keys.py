"""Stage keys: stable across processes, untouched by runtime and label fields, upstream keys
unchanged by downstream settings, and built from canonical JSON."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SERVER_HASH_SEED, TINY_SPEC, CliRunner, cli_env, run_fedhet, write_spec

from fedhet.core.keys import canonical_json, stage_key
from fedhet.core.spec import load_spec, parse_spec
from fedhet.execution.planning import runs_of

QUICKSTART = Path(__file__).resolve().parents[1] / "specs" / "quickstart.yaml"


def set_field(data: dict, dotted: str, value: Any) -> dict:
    data = json.loads(json.dumps(data))
    *parents, leaf = dotted.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return data


def keys_of(data: dict) -> dict[str, str]:
    """stage -> key for the single run of a spec mapping."""
    (run,) = runs_of(parse_spec(data))
    return {node.stage: node.key for node in run.node.walk()}


BASE = {**TINY_SPEC, "algorithm": {"name": "fedprox", "mu": 0.01}}


# --- the same spec, two processes ---------------------------------------------------------


def test_spec_hash_is_identical_in_two_processes_and_matches_the_planner(fedhet: CliRunner):
    """A fresh `python -m fedhet` and the fork server's child: two interpreters whose str
    hashing differs (PYTHONHASHSEED), so set or dict ordering cannot leak into a key."""
    first = run_fedhet("spec", "hash", QUICKSTART, env=cli_env(PYTHONHASHSEED="1"))
    second = fedhet("spec", "hash", QUICKSTART)
    assert SERVER_HASH_SEED != "1"
    assert first.rc == second.rc == 0, first.stderr + second.stderr
    assert first.stdout == second.stdout
    printed = re.findall(r"^(\w+) +([0-9a-f]{64})$", first.stdout, flags=re.M)
    planned = [
        (node.stage, node.key) for run in runs_of(load_spec(QUICKSTART)) for node in run.node.walk()
    ]
    assert printed == planned
    assert len({key for _, key in printed}) == 2 + 10  # 2 partitions shared by 10 train runs


# --- what enters a key --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("federation.lr", 0.2),
        ("algorithm.mu", 0.5),
        ("federation.rounds", 3),
        ("model.hidden", [8]),
    ],
)
def test_downstream_change_keeps_the_partition_key_and_changes_train(field: str, value: Any):
    before, after = keys_of(BASE), keys_of(set_field(BASE, field, value))
    assert after["partition"] == before["partition"]
    assert after["train"] != before["train"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("seed", 4), ("partition.alpha", 0.1), ("partition.clients", 5), ("data.dataset", "mnist")],
)
def test_upstream_change_changes_every_key_below_it(field: str, value: Any):
    before, after = keys_of(BASE), keys_of(set_field(BASE, field, value))
    assert after["partition"] != before["partition"]
    assert after["train"] != before["train"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "renamed"),
        ("description", "another description"),
        ("data.root", "/somewhere/else"),
        ("data.download", True),
        ("eval.target_accuracy", 0.5),
        ("runtime.device", "cpu"),
        ("runtime.threads", 7),
        ("runtime.progress", False),
        ("runtime.checkpoint_every", 2),
        ("runtime.eval_batch_size", 17),
    ],
)
def test_label_and_runtime_fields_never_change_a_key(field: str, value: Any):
    assert keys_of(set_field(BASE, field, value)) == keys_of(BASE)


def test_equal_configs_written_differently_give_equal_keys():
    reordered = dict(reversed(list(BASE.items())))
    explicit = set_field(BASE, "federation.lr", 5e-2)  # 0.05 written another way
    explicit = set_field(explicit, "partition.min_samples", 0)  # a default, spelled out
    assert keys_of(reordered) == keys_of(explicit) == keys_of(BASE)


# --- canonical JSON -----------------------------------------------------------------------


def test_canonical_json_is_sorted_compact_and_tags_floats():
    value = {"b": [1, 0.5, "x", None, True], "a": {"d": 1e-7, "c": -0.0}}
    assert canonical_json(value) == (
        '{"a":{"c":{"float":"-0.0"},"d":{"float":"1e-07"}},"b":[1,{"float":"0.5"},"x",null,true]}'
    )


def test_floats_are_exact_and_distinct_from_ints():
    assert canonical_json({"x": 0.1 + 0.2}) != canonical_json({"x": 0.3})
    assert canonical_json({"x": 1}) != canonical_json({"x": 1.0})
    assert canonical_json({"x": True}) != canonical_json({"x": 1})
    for x in (0.1, 1 / 3, 1e300, 5e-324):
        (text,) = re.findall(r'"float":"([^"]+)"', canonical_json({"x": x}))
        assert float(text) == x


def test_numpy_scalars_hash_like_python_numbers():
    python = {"lr": 0.1, "clients": 10, "angles": [15.0, 30.0]}
    numpy = {"lr": np.float64(0.1), "clients": np.int64(10), "angles": list(np.array([15.0, 30.0]))}
    assert canonical_json(numpy) == canonical_json(python)


def test_non_finite_floats_cannot_enter_a_key():
    for bad in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match="non-finite"):
            canonical_json({"x": bad})


def test_stage_key_is_sha256_of_stage_version_config_and_upstream():
    config, upstream = {"alpha": 0.5, "clients": 10}, {"partition": "ab" * 32}
    payload = {"stage": "train", "version": 3, "config": config, "upstream": upstream}
    expected = hashlib.sha256(canonical_json(payload).encode()).hexdigest()
    assert stage_key("train", 3, config, upstream) == expected
    assert stage_key("train", 4, config, upstream) != expected  # a format bump re-keys
    assert stage_key("train", 3, config, {"partition": "cd" * 32}) != expected
    assert stage_key("eval", 3, config, upstream) != expected


def test_spec_file_and_its_filled_in_dump_give_the_same_keys(tmp_path: Path):
    path = write_spec(tmp_path / "tiny.yaml", BASE)
    dumped = load_spec(path).model_dump(mode="json")
    assert keys_of(dumped) == keys_of(BASE)


@pytest.mark.parametrize("name", ["fedavg", "scaffold"])
def test_revision_zero_adds_nothing_to_the_train_key_and_a_revision_changes_it(monkeypatch, name):
    """Keys from before revisions existed stay valid: revision 0 leaves the train config exactly
    as it was (no `algorithm_revision` entry); revision r > 0 adds it, and so changes the key."""
    from fedhet.engine.train_plan import train_node

    spec = parse_spec({**TINY_SPEC, "algorithm": {"name": name}})
    unrevised = {
        "seed": spec.seed,
        "model": spec.model.model_dump(mode="json"),
        "federation": spec.federation.model_dump(mode="json"),
        "algorithm": spec.algorithm.model_dump(mode="json"),
        "eval_every": spec.eval.every,
    }
    monkeypatch.setattr(type(spec.algorithm), "revision", 0)
    node = train_node(spec)
    partition_key = node.upstream["partition"].key
    assert node.key == stage_key("train", node.version, unrevised, {"partition": partition_key})
    keys = {node.key}
    for revision in (1, 2):
        monkeypatch.setattr(type(spec.algorithm), "revision", revision)
        revised = train_node(spec)
        assert revised.config == {**unrevised, "algorithm_revision": revision}
        assert revised.upstream["partition"].key == partition_key
        keys.add(revised.key)
    assert len(keys) == 3
