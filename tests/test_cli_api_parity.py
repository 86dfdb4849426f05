"""`fedhet.load` and the command line load a spec through one function
(fedhet.execution.loading), so they refuse the same specs with the same one-line message: the
command line prints it after `error: `, the Python API raises it as InputError."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import TINY_SPEC, CliRunner, write_spec

from fedhet import load
from fedhet.core.errors import InputError

ARRAYS = {"dataset": "arrays", "path": "missing.npz"}

BAD_SPECS = {  # name: (the spec's changes to TINY_SPEC, the overrides, what the message says)
    "a client with no sample": (
        {"partition": {"scheme": "iid", "clients": 1439}},
        [],
        "partition.clients: 1439 clients for the 1438 training samples of digits",
    ),
    "a model that does not fit": (
        {"model": {"arch": "mlp", "hidden": [10**6, 10**6]}},
        [],
        "model (mlp): 1,000,076,000,010 parameters need about",
    ),
    "an unknown field": ({"federation": {**TINY_SPEC["federation"], "bogus": 1}}, [], "bogus"),
    "a bad override": ({}, ["federation.rounds=true"], "federation.rounds"),
    "a missing data file": ({"data": ARRAYS}, [], "missing.npz"),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_the_api_and_the_command_line_refuse_the_same_spec_with_the_same_line(
    fedhet: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
):
    changes, overrides, named = BAD_SPECS[case]
    write_spec(tmp_path / "bad.yaml", TINY_SPEC | changes)
    store = tmp_path / "store"
    result = fedhet("spec", "validate", "bad.yaml", *overrides, store=store, cwd=tmp_path)
    assert result.rc == 2 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip("\n").splitlines()

    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as refused:
        load("bad.yaml", *overrides, store=store)
    assert same_machine(line) == same_machine(f"error: {refused.value}")
    assert named in line
    assert not store.exists()


def test_a_spec_both_accept_loads_the_same(fedhet: CliRunner, tmp_path: Path, monkeypatch):
    """The control: with the changes undone, both accept the spec (the same runs)."""
    write_spec(tmp_path / "good.yaml", TINY_SPEC)
    result = fedhet("spec", "validate", "good.yaml", "seed=4", cwd=tmp_path)
    assert (result.rc, result.stdout) == (0, "good.yaml: valid (1 run)\n"), result.stderr
    monkeypatch.chdir(tmp_path)
    experiment = load("good.yaml", "seed=4", store=tmp_path / "store")
    assert experiment.spec.seed == 4 and len(experiment.runs()) == 1


def same_machine(message: str) -> str:
    """The message less the memory this machine has free, which changes from call to call."""
    return re.sub(r"[\d,.]+ GiB this machine", "N GiB this machine", message)
