"""The round a plug-in's hooks get: the plug-in of docs/how-to/write-a-method.md, read from the page
(registered in-process as pip would, and installed by pip from the page's module and
pyproject.toml), shrinks FedAvg's server step by `decay ** round`. Its hooks get the
round the page promises (0 first), and the round that logs and exports number 1 is that first
round: there its step is FedAvg's whole step, after it not."""

from __future__ import annotations

import csv
import io
import re
import subprocess
import sys
from importlib.metadata import EntryPoint, entry_points

import pytest
import torch
from conftest import REPO, CliRunner, cli_env, write_spec

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


def page_block(language: str) -> str:
    """The page's block of `language` marked for this test (the plug-in's module, its
    pyproject.toml), as written there."""
    text = (REPO / PAGE).read_text()
    marker = "<!-- docs-test: by tests/test_plugin_rounds.py -->"
    block = re.search(re.escape(marker) + rf"\n```{language}\n(.*?)```", text, re.S)
    assert block, f"{PAGE} has the decayavg plug-in's {language} block, marked for this test"
    return block.group(1)


@pytest.fixture
def decayavg(tmp_path, monkeypatch):
    """The page's plug-in saved as fedhet_decay.py and registered through its entry point."""
    (tmp_path / "fedhet_decay.py").write_text(page_block("python"))
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


@pytest.mark.slow
def test_installed_from_the_page_its_first_exported_round_is_the_hooks_round_0(
    fedhet: CliRunner, tmp_path
):
    """The page's two files, installed by pip (offline; into a folder of the test's, not
    editable as the page's .venv install), train through the command line: the round the
    export numbers 1 has FedAvg's whole step (decay ** 0), round 2 half of it."""
    package = tmp_path / "fedhet-decay"
    package.mkdir()
    (package / "fedhet_decay.py").write_text(page_block("python"))
    (package / "pyproject.toml").write_text(page_block("toml"))
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip, "--no-index", "--target", str(site), str(package)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    both = [{"name": "fedavg"}, {"name": "decayavg", "decay": DECAY}]
    raw = {k: v for k, v in SPEC.items() if k != "algorithm"} | {"matrix": {"algorithm": both}}
    spec = write_spec(tmp_path / "decay.yaml", raw)
    env = cli_env(tmp_path / "store", PYTHONPATH=str(site))
    trained = fedhet("train", spec, env=env)
    assert trained.rc == 0, trained.stderr
    exported = fedhet("export", spec, "--format", "csv", env=env)
    loss: dict[str, dict[int, float]] = {}
    for row in csv.DictReader(io.StringIO(exported.stdout)):
        method = "fedavg" if row["algorithm"] == "FedAvg" else "decayavg"
        loss.setdefault(method, {})[int(row["round"])] = float(row["test_loss"])
    assert sorted(loss["decayavg"]) == [1, 2, 3]
    # decay ** 0: FedAvg's model after round 1 (x + 1 * (avg - x): avg up to rounding)
    assert loss["decayavg"][1] == pytest.approx(loss["fedavg"][1], rel=1e-6)
    assert loss["decayavg"][2] != pytest.approx(loss["fedavg"][2], rel=1e-3)  # half its step
