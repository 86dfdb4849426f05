"""Every way out of the installed `fedhet` console script, as a user meets it: help, version,
usage errors, an unexpected failure inside a run, and SIGINT/SIGTERM during `train` (checkpoint
kept, the same command resumes, and the result equals an uninterrupted run's bit for bit)."""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import TINY_SPEC, CliResult, CliRunner, cli_env, run_fedhet, write_spec

from fedhet import __version__
from fedhet.core.store import ArtifactStore

SCRIPT = Path(sys.executable).with_name("fedhet")  # the console script pip installed


def installed(*args, env: dict[str, str] | None = None, timeout: float = 180) -> CliResult:
    proc = subprocess.run(
        [SCRIPT, *map(str, args)], capture_output=True, text=True, env=env or cli_env(),
        timeout=timeout,
    )  # fmt: skip
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def stderr_lines(result: CliResult) -> list[str]:
    return result.stderr.strip("\n").splitlines()


@pytest.mark.parametrize("group", [[], ["spec"], ["artifacts"]])
def test_no_arguments_prints_help_once_on_stdout(group):
    result = installed(*group)
    assert result.rc == 0, result.stderr
    assert result.stdout.count("Usage: fedhet") == 1 and "Commands" in result.stdout
    assert result.stderr == ""


def test_help_paragraphs_rewrap_to_the_terminal_width():
    """A docstring's source line breaks are not kept: at 80 columns every line of the train
    help's description is broken only where the next word would not fit."""
    result = installed("train", "--help", env={**cli_env(), "COLUMNS": "80"})
    description = result.stdout.split("Usage:")[1].split("Arguments")[0].splitlines()[1:]
    lines = [line.strip() for line in description]
    assert sum(map(len, lines)) > 200  # the two paragraphs are there
    for line, following in zip(lines, lines[1:], strict=False):
        if line and following:  # inside a paragraph
            assert len(line) + 1 + len(following.split()[0]) > 78, (line, following)


def test_version():
    result = installed("--version")
    assert (result.rc, result.stdout, result.stderr) == (0, f"fedhet {__version__}\n", "")


USAGE_ERRORS = {
    "unknown command": (["frobnicate"], "No such command 'frobnicate'"),
    "unknown option": (["train", "--frobnicate", "x.yaml"], "No such option: --frobnicate"),
    "missing argument": (["train"], "Missing argument 'SPEC'"),
    "missing spec file": (["train", "nope.yaml"], "nope.yaml: spec file not found"),
}


@pytest.mark.parametrize("case", sorted(USAGE_ERRORS))
def test_usage_errors_are_one_line_with_exit_2(case: str, tmp_path: Path):
    args, expected = USAGE_ERRORS[case]
    result = installed(*args, env=cli_env(tmp_path / "store"))
    assert result.rc == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = stderr_lines(result)
    assert line.startswith("error: ") and expected in line
    assert not (tmp_path / "store").exists()


# --- an unexpected failure inside a run ---------------------------------------------------


# A fault fedhet cannot anticipate, injected at interpreter start (a `sitecustomize` module on
# PYTHONPATH): reading a stored partition raises ZeroDivisionError. (Damaged stored data is no
# longer such a fault: every read of the store names what is damaged.)
FAULT = """
import fedhet.data.partition_format as partition_format


def load_index_lists(group):
    raise ZeroDivisionError("an injected fault")


partition_format.load_index_lists = load_index_lists
"""


@pytest.fixture(scope="module")
def crashing(
    fedhet: CliRunner, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, Path]:
    """(spec, store, folder): a stored partition, and a folder whose `sitecustomize` makes
    reading it fail unexpectedly in every `python` started with the folder on PYTHONPATH."""
    root = tmp_path_factory.mktemp("crashing")
    spec, store = write_spec(root / "tiny.yaml", TINY_SPEC), root / "store"
    assert fedhet("partition", spec, store=store).rc == 0
    fault = root / "fault"
    fault.mkdir()
    (fault / "sitecustomize.py").write_text(FAULT)
    return spec, store, fault


def crash_env(store: Path, fault: Path, crash_dir: Path) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(fault), os.environ.get("PYTHONPATH")]))
    return cli_env(store, FEDHET_CRASH_DIR=str(crash_dir), PYTHONPATH=path)


CRASH_LINE = re.compile(
    r"error: unexpected (\w+) at (\w+\.py):\d+ \((\w+)\): (.+); full traceback in (\S+)"
    r" \(or rerun with --debug\)"
)


def test_an_unexpected_exception_is_one_line_with_the_traceback_in_a_file(
    crashing: tuple[Path, Path, Path], tmp_path: Path
):
    spec, store, fault = crashing
    result = run_fedhet("train", spec, env=crash_env(store, fault, tmp_path))
    assert result.rc == 1, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in stderr_lines(result) if line.startswith("error")]
    assert errors == stderr_lines(result)[-1:]
    match = CRASH_LINE.fullmatch(errors[0])
    assert match, errors[0]
    kind, module, function, message, path = match.groups()
    assert (kind, function) == ("ZeroDivisionError", "load_partition")
    assert module == "partition_format.py"
    written = Path(path).read_text()
    assert Path(path).parent == tmp_path
    assert written.startswith("Traceback (most recent call last)")
    assert f"{kind}: {message}" in written and "load_partition" in written  # the caller
    assert not list(store.glob("*/*.tmp-*"))  # the train artifact's temporary is gone


@pytest.mark.parametrize("how", ["--debug", "FEDHET_DEBUG=1"])
def test_debug_shows_the_traceback(crashing: tuple[Path, Path, Path], tmp_path: Path, how: str):
    spec, store, fault = crashing
    env = crash_env(store, fault, tmp_path)
    args = ["train", spec]
    if how == "--debug":
        args.insert(0, "--debug")
    else:
        env["FEDHET_DEBUG"] = "1"
    result = run_fedhet(*args, env=env)
    assert result.rc == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert "in load_partition" in result.stderr
    assert re.search(r"error: unexpected \w+ at partition_format\.py", stderr_lines(result)[-1])


# --- interrupts -----------------------------------------------------------------------------

ROUNDS = 12  # margin enough for the signal to land mid-run on a busy machine
SLOW_SPEC = {
    **TINY_SPEC,
    "name": "interruptible",
    "model": {"arch": "mlp", "hidden": [32]},
    "federation": {"rounds": ROUNDS, "batch_size": 16, "lr": 0.05},
    "runtime": {"threads": 1, "progress": False},  # the reference writes no checkpoint
}


def stored_arrays(store: Path) -> dict[str, np.ndarray]:
    """Every array of the store's one train artifact but the wall times, by path."""
    (info,) = [a for a in ArtifactStore(store).ls() if a.stage == "train"]
    arrays: dict[str, np.ndarray] = {}

    def walk(group: zarr.Group, prefix: str) -> None:
        for name, member in group.members():
            if isinstance(member, zarr.Array):
                arrays[prefix + name] = member[...]
            else:
                walk(member, f"{prefix}{name}/")

    walk(zarr.open_group(info.path, mode="r"), "")
    return {name: values for name, values in arrays.items() if not name.endswith("wall_time")}


@pytest.fixture(scope="module")
def uninterrupted(fedhet: CliRunner, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("uninterrupted")
    spec, store = write_spec(root / "spec.yaml", SLOW_SPEC), root / "store"
    result = fedhet("train", spec, store=store)
    assert result.rc == 0, result.stderr
    return stored_arrays(store)


def wait_for_checkpoint(store: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not list(store.glob("train/*.partial/ckpt-*.zarr")):
        assert proc.poll() is None, "fedhet train ended before its first checkpoint"
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.05)


INTERRUPTED = re.compile(
    rf"interrupted at round (\d+) of {ROUNDS} \(train ([0-9a-f]{{12}})\); "
    "run the same command to resume"
)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_keeps_the_checkpoint_and_the_same_command_resumes(
    fedhet: CliRunner, uninterrupted: dict, tmp_path: Path, signum: signal.Signals
):
    spec, store = write_spec(tmp_path / "spec.yaml", SLOW_SPEC), tmp_path / "store"
    command = [SCRIPT, "train", spec, "runtime.checkpoint_every=1", "--store", store]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_checkpoint(store, proc)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, stderr
    assert "Traceback" not in stderr
    match = INTERRUPTED.fullmatch(stderr.strip().splitlines()[-1])
    assert match, stderr
    round_number, key12 = int(match[1]), match[2]
    assert 1 < round_number <= ROUNDS
    (partial,) = store.glob(f"train/{key12}*.partial")
    checkpoints = [p.name for p in partial.glob("ckpt-*.zarr")]
    assert checkpoints == [f"ckpt-{round_number - 1:06d}.zarr"]  # the last completed round
    assert not list(store.glob("train/*.zarr")) and not list(store.glob("*/*.tmp-*"))

    resumed = fedhet(*command[1:])  # the same command (forked `main()`, to save a start-up)
    assert resumed.rc == 0, resumed.stderr
    assert f"resuming train {key12} from round {round_number} of {ROUNDS}" in resumed.stderr
    assert "computing" not in resumed.stderr  # the partition is reused, the run resumed
    arrays = stored_arrays(store)
    assert arrays.keys() == uninterrupted.keys()
    for name, expected in uninterrupted.items():
        assert np.array_equal(arrays[name], expected, equal_nan=True), name
    assert not partial.exists()


# --- validation is fast -----------------------------------------------------------------------

QUICKSTART = Path(__file__).resolve().parents[1] / "specs" / "quickstart.yaml"
HEAVY = ("torch", "torchvision", "matplotlib", "sklearn")


def test_spec_validate_imports_no_torch_and_answers_within_a_second():
    probe = (
        "import sys, runpy\n"
        f"sys.argv = ['fedhet', 'spec', 'validate', {str(QUICKSTART)!r}]\n"
        "try:\n    runpy.run_module('fedhet', run_name='__main__')\n"
        "except SystemExit as exit:\n    assert exit.code == 0, exit.code\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]", proc.stdout  # none of them imported
    times = []  # the command's CPU seconds: wall time on a loaded machine says nothing about it
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = installed("spec", "validate", QUICKSTART)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        times.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        assert result.rc == 0, result.stderr
    assert min(times) < 1.0, times  # about 0.6 CPU-s
