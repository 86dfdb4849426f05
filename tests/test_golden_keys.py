"""Stored runs can be GPU-days: the stage keys of every committed spec must not change by accident.

`tests/golden/keys.json` holds every stage key of every run of every spec under `specs/`. A change
that alters a key on purpose regenerates it (`FEDHET_UPDATE_GOLDEN=1 pytest
tests/test_golden_keys.py`) in the same commit and says why in the message.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fedhet.core.spec import load_spec
from fedhet.execution.planning import runs_of

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "keys.json"
SPECS = sorted((REPO / "specs").glob("*.yaml"))


def spec_keys(path: Path) -> list[dict[str, str]]:
    """Per run (in matrix order): stage -> key, for the run's node and all its upstream nodes."""
    return [
        {f"{node.stage}#{i}": node.key for i, node in enumerate(run.node.walk())}
        for run in runs_of(load_spec(path))
    ]


def current() -> dict[str, list[dict[str, str]]]:
    return {path.name: spec_keys(path) for path in SPECS}


if os.environ.get("FEDHET_UPDATE_GOLDEN") == "1":
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(current(), indent=1, sort_keys=True) + "\n")


def test_every_committed_spec_is_in_the_golden_file():
    assert sorted(json.loads(GOLDEN.read_text())) == [p.name for p in SPECS]


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_stage_keys_are_unchanged(path):
    expected = json.loads(GOLDEN.read_text())[path.name]
    actual = spec_keys(path)
    assert len(actual) == len(expected), "the spec's number of runs changed"
    for number, (want, got) in enumerate(zip(expected, actual, strict=True)):
        assert got == want, f"run {number} of {path.name}: stage keys changed"
