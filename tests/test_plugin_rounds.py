"""The round a plug-in's hooks get: the plug-in of docs/how-to/write-a-method.md, read from the page
and registered as pip would, shrinks FedAvg's server step by `decay ** round`. Its hooks get the
round the page promises (0 first), and the round that logs and exports number 1 is that first
round: there its step is FedAvg's whole step, after it not."""

from __future__ import annotations

import re
from importlib.metadata import EntryPoint, entry_points

import pytest
import torch
from conftest import REPO

import fedhet
from fedhet.core import registry
from fedhet.core.spec import parse_spec
from fedhet.engine import tensors
from fedhet.engine.loop import Engine
from fedhet.engine.trainer import Trainer

PAGE = "docs/how-to/write-a-method.md"
ROUNDS, DECAY = 3, 0.5
SPEC = {
    "name": "decay",
    "seed": 2,
    "data": {"dataset": "digits"},
    "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.5},
    "model": {"arch": "mlp", "hidden": [16]},
    "federation": {"rounds": ROUNDS, "batch_size": 32, "lr": 0.05},
    "algorithm": {"name": "decayavg", "decay": DECAY},
    "runtime": {"threads": 1, "progress": False, "device": "cpu"},
}


def page_plugin() -> str:
    """The page's one-module plug-in, as written there."""
    text = (REPO / PAGE).read_text()
    marker = "<!-- docs-test: by tests/test_plugin_rounds.py -->"
    block = re.search(re.escape(marker) + r"\n```python\n(.*?)```", text, re.S)
    assert block, f"{PAGE} has the decayavg plug-in, marked for this test"
    return block.group(1)


@pytest.fixture
def decayavg(tmp_path, monkeypatch):
    """The page's plug-in saved as fedhet_decay.py and registered through its entry point."""
    (tmp_path / "fedhet_decay.py").write_text(page_plugin())
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = EntryPoint("decayavg", "fedhet_decay:METHOD", registry.GROUP)
    installed = [*entry_points(group=registry.GROUP), entry]
    monkeypatch.setattr(registry, "entry_points", lambda group: installed)
    registry._load.cache_clear()
    yield
    registry._load.cache_clear()  # the next test loads the registry without it


def test_the_hooks_round_counts_from_0(decayavg, tmp_path):
    """Round by round: x + decay**r (avg - x), avg FedAvg's average of the same clients, r the
    engine's round index (0 first)."""
    spec = parse_spec(SPEC)
    engine = Engine.from_spec(spec, tmp_path / "decay")
    fedavg = Engine.from_spec(spec, tmp_path / "fedavg", trainer=Trainer)
    state = engine.initial_state()
    for rnd in range(ROUNDS):
        x, averaged = tensors.clone(state.global_state), fedavg.initial_state()
        averaged.global_state = tensors.clone(x)
        fedavg.run_round(rnd, averaged)
        engine.run_round(rnd, state)
        for name, value in state.global_state.items():
            expected = x[name] + DECAY**rnd * (averaged.global_state[name] - x[name])
            torch.testing.assert_close(value, expected, rtol=0, atol=0)


def test_the_first_round_of_the_export_is_the_hooks_round_0(decayavg, tmp_path):
    decay = fedhet.load(SPEC, store=tmp_path)
    fedavg = fedhet.load(SPEC, "algorithm={name: fedavg}", store=tmp_path)
    decay.train(), fedavg.train()
    ours, theirs = (e.metrics().set_index("round").test_loss for e in (decay, fedavg))
    assert list(ours.index) == [1, 2, 3]
    # decay ** 0: FedAvg's model after round 1 (x + 1 * (avg - x): avg up to rounding)
    assert ours[1] == pytest.approx(theirs[1], rel=1e-6)
    assert ours[2] != pytest.approx(theirs[2], rel=1e-3)  # decay ** 1: half its step
