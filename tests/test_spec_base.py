"""A spec derives from another (`base: other.yaml` plus changes): sections merge field by field,
a changed choice (algorithm name, partition scheme, model arch) replaces its section, a matrix
axis set to null is dropped; cycles and missing bases are refused in one line."""

from __future__ import annotations

import yaml
from conftest import CliRunner

from fedhet.core.spec import derived, load_mapping, load_spec

BASE = {
    "name": "base",
    "data": {"dataset": "digits"},
    "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.5},
    "model": {"arch": "mlp", "hidden": [16]},
    "federation": {"rounds": 3, "batch_size": 32, "lr": 0.05},
    "algorithm": {"name": "fedprox", "mu": 0.1},
    "matrix": {"seed": [0, 1], "federation.lr": [0.05, 0.1]},
}


def write(folder, name: str, data: dict) -> str:
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def test_a_derived_spec_is_its_base_with_the_changes_merged(tmp_path):
    write(tmp_path, "base.yaml", BASE)
    changes = {
        "base": "base.yaml",
        "name": "long",
        "federation": {"rounds": 30},
        "algorithm": {"name": "scaffold"},  # a new choice: the section is replaced
        "partition": {"alpha": 0.1},  # the same choice: merged
        "matrix": {"federation.lr": None},  # dropped
    }
    child = load_spec(write(tmp_path, "long.yaml", changes))
    expected = {
        **BASE,
        "name": "long",
        "federation": {"rounds": 30, "batch_size": 32, "lr": 0.05},
        "algorithm": {"name": "scaffold"},
        "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.1},
        "matrix": {"seed": [0, 1]},
    }
    assert child == load_spec(write(tmp_path, "edited.yaml", expected))
    assert derived({"a": {"x": 1, "y": 2}}, {"a": {"y": 3}}) == {"a": {"x": 1, "y": 3}}


def test_a_chain_of_bases_resolves_relative_to_each_file(tmp_path):
    (tmp_path / "deep").mkdir()
    write(tmp_path, "base.yaml", BASE)
    write(tmp_path / "deep", "middle.yaml", {"base": "../base.yaml", "seed": 4})
    top = write(tmp_path, "top.yaml", {"base": "deep/middle.yaml", "name": "top"})
    mapping = load_mapping(top)
    assert mapping["seed"] == 4 and mapping["name"] == "top" and "base" not in mapping


def test_cycles_and_missing_bases_are_refused_in_one_line(fedhet: CliRunner, tmp_path):
    write(tmp_path, "a.yaml", {**BASE, "base": "b.yaml"})
    cyclic = write(tmp_path, "b.yaml", {"base": "a.yaml"})
    missing = write(tmp_path, "c.yaml", {"base": "nowhere.yaml"})
    for path, words in ((cyclic, "derives from itself"), (missing, "spec file not found")):
        result = fedhet("spec", "validate", path)
        assert result.rc == 2 and "Traceback" not in result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert words in line
