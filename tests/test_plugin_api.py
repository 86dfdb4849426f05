"""fedhet.plugin, the one module a method author imports. The plug-ins in tests/plugins (the
example, and FedAvgM: server momentum in two small modules) import nothing else of fedhet, as
fedhet's own methods (an import-linter contract in pyproject.toml); FedAvgM, registered through
its entry point, trains under both client executors and is its definition; the module's
description side imports no torch, and every name it lists resolves."""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import pytest
import torch

from fedhet.core import registry
from fedhet.core.spec import parse_spec
from fedhet.engine import tensors
from fedhet.engine.client_executors import executor_name
from fedhet.engine.loop import Engine
from fedhet.engine.trainer import Trainer

torch.set_num_threads(1)
PLUGINS = Path(__file__).parent / "plugins"
ROUNDS = 3
SPEC = {
    "seed": 3,
    "partition": {"scheme": "dirichlet", "clients": 6, "alpha": 0.5},
    "model": {"arch": "mlp", "hidden": [16]},
    "federation": {"rounds": ROUNDS, "batch_size": 32, "lr": 0.05},
    "algorithm": {"name": "plugin_fedavgm", "beta": 0.9, "server_lr": 0.7},
    "runtime": {"progress": False},
}


def fedhet_imports(package: Path) -> set[str]:
    """Every fedhet module the package's files import, at any depth (in functions too)."""
    found = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            found |= {name for name in names if name == "fedhet" or name.startswith("fedhet.")}
    return found


@pytest.mark.parametrize("package", ["fedhet_example", "fedhet_fedavgm"])
def test_a_plugin_imports_only_fedhet_plugin(package):
    assert fedhet_imports(PLUGINS / package) == {"fedhet.plugin"}


@pytest.fixture
def fedavgm(monkeypatch):
    """tests/plugins/fedhet_fedavgm registered through its entry point, as pip would."""
    entry = EntryPoint("plugin_fedavgm", "fedhet_fedavgm.plugin:METHOD", registry.GROUP)
    installed = [*entry_points(group=registry.GROUP), entry]
    monkeypatch.syspath_prepend(str(PLUGINS / "fedhet_fedavgm"))
    monkeypatch.setattr(registry, "entry_points", lambda group: installed)
    registry._load.cache_clear()
    yield
    registry._load.cache_clear()  # the next test loads the registry without it


def test_fedavgm_is_server_momentum_on_the_fedavg_average(fedavgm, tmp_path):
    """Round by round from FedAvgM's own states: v <- beta v + (x - avg), x <- x - lr_s v, avg
    the FedAvg average of the same round's clients (computed by FedAvg's trainer)."""
    spec = parse_spec(SPEC)
    engine = Engine.from_spec(spec, tmp_path / "fedavgm")
    fedavg = Engine.from_spec(spec, tmp_path / "fedavg", trainer=Trainer)
    state = engine.initial_state()
    velocity = tensors.clone(state.server_state)
    assert velocity.keys() == engine.algorithm.param_names
    for rnd in range(ROUNDS):
        x, averaged = tensors.clone(state.global_state), fedavg.initial_state()
        averaged.global_state = tensors.clone(x)
        fedavg.run_round(rnd, averaged)
        engine.run_round(rnd, state)
        for name, v in velocity.items():
            v.mul_(0.9).add_(x[name] - averaged.global_state[name])
            torch.testing.assert_close(state.server_state[name], v, rtol=0, atol=0)
            expected = x[name] - 0.7 * v
            torch.testing.assert_close(state.global_state[name], expected, rtol=0, atol=0)
    moved = tensors.distance(state.global_state, averaged.global_state)
    assert moved > 1e-3  # the momentum is live: FedAvgM is not FedAvg


def test_fedavgm_trains_under_both_client_executors(fedavgm, tmp_path):
    runs = {}
    for clients in ("sequential", "vectorized"):
        spec = parse_spec({**SPEC, "runtime": {"progress": False, "clients": clients}})
        engine = Engine.from_spec(spec, tmp_path / clients)
        runs[clients] = engine.run()
        assert executor_name(engine.executor) == clients
    sequential, vectorized = runs["sequential"].global_state, runs["vectorized"].global_state
    for name in sequential:  # the same steps, rounded differently in float32
        torch.testing.assert_close(vectorized[name], sequential[name], rtol=1e-4, atol=1e-5)


def test_the_description_side_imports_no_torch_and_every_name_resolves():
    code = (
        "import sys, fedhet.plugin as p\n"
        "assert 'torch' not in sys.modules\n"
        "missing = [n for n in p.__all__ if getattr(p, n, None) is None]\n"
        "assert not missing, missing\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
