"""Every artifact records the environment it was computed in (never in its key), `artifacts
show` prints it, and reusing or reporting results computed elsewhere is said in one line."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import zarr
from conftest import CliRunner, write_spec

from fedhet import __version__
from fedhet.core import provenance
from fedhet.core.sealed import seal
from fedhet.core.spec import parse_spec
from fedhet.core.store import ArtifactStore
from fedhet.execution.planning import runs_of
from fedhet.execution.results import execute

SPEC = {
    "name": "provenance",
    "data": {"dataset": "digits"},
    "partition": {"scheme": "iid", "clients": 3},
    "model": {"arch": "mlp", "hidden": []},
    "federation": {"rounds": 1, "batch_size": 64, "lr": 0.1},
    "runtime": {"threads": 1, "progress": False, "device": "cpu"},
}


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_environment_names_versions_build_threads_device_and_platform(one_thread):
    torch.set_num_threads(1)
    env = provenance.environment()
    assert env["fedhet"] == __version__
    assert (env["torch"], env["torch_cuda"], env["torch_git"]) == (
        torch.__version__,
        torch.version.cuda,
        torch.version.git_version,
    )
    assert env["cpu"] == torch.backends.cpu.get_cpu_capability()  # e.g. AVX2, AVX512
    assert env["threads"] == 1 and env["device"] == "cpu" and "gpu" not in env
    assert env["platform"] == platform.platform() and env["machine"] == platform.machine()
    assert env["python"] == platform.python_version()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_revision_is_head_and_dirty_only_for_changes_outside_reports(tmp_path):
    """A report written by `make reproduce` and not yet committed leaves the next run computed
    from the commit; any other tracked change makes it "uncommitted changes"."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "table.md").write_text("old\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")

    def revision() -> dict | None:
        provenance.git_revision.cache_clear()
        try:
            return provenance.git_revision(tmp_path.resolve())
        finally:
            provenance.git_revision.cache_clear()

    head = git("rev-parse", "HEAD")
    (tmp_path / "reports" / "table.md").write_text("new\n")
    (tmp_path / "untracked.py").write_text("y = 2\n")
    assert revision() == {"revision": head, "dirty": False}
    (tmp_path / "code.py").write_text("x = 2\n")
    assert revision() == {"revision": head, "dirty": True}


def test_without_git_the_revision_is_absent_and_nothing_fails(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on it
    provenance.git_revision.cache_clear()
    try:
        env = provenance.environment()
    finally:
        provenance.git_revision.cache_clear()
    assert "git" not in env and env["torch"] == torch.__version__


def test_the_store_records_the_thread_count_the_stage_computed_with(tmp_path, one_thread):
    store = ArtifactStore(tmp_path)
    with store.lock("x", "k"), store.write("x", "k", {}):
        torch.set_num_threads(2)  # what a stage does when runtime.threads says so
    recorded = store.open("x", "k").attrs["environment"]
    assert recorded["threads"] == 2
    assert recorded == provenance.environment()  # the rest: this process


def test_a_run_reused_from_another_environment_is_announced_in_one_line(
    tmp_path, one_thread, capsys
):
    (run,) = runs_of(parse_spec(SPEC))
    store = ArtifactStore(tmp_path)
    torch.set_num_threads(2)  # the process's default differs from the spec's runtime.threads
    execute(run, store)
    assert (
        store.open("partition", run.node.upstream["partition"].key).attrs["environment"]["threads"]
        == 1
    )  # every stage of the run computes with the spec's threads
    stored = zarr.open_group(store.path("train", run.node.key), mode="r+")
    stored.attrs["environment"] = {**stored.attrs["environment"], "threads": 7, "torch": "2.0.0"}
    seal(stored)  # as computed there
    capsys.readouterr()
    execute(run, store)
    lines = capsys.readouterr().err.splitlines()
    assert [line for line in lines if "another environment" in line] == [
        f"train {run.node.key[:12]}: reusing the stored artifact, computed under another "
        f"environment: 7 threads (now 1 thread), torch 2.0.0 (now torch {torch.__version__})"
    ]


def test_a_run_reused_across_cpu_vector_instruction_sets_is_announced_in_one_line(
    tmp_path, one_thread, capsys
):
    (run,) = runs_of(parse_spec(SPEC))
    store = ArtifactStore(tmp_path)
    execute(run, store)
    stored = zarr.open_group(store.path("train", run.node.key), mode="r+")
    recorded = dict(stored.attrs["environment"])
    here = recorded["cpu"]
    elsewhere = "AVX2" if here != "AVX2" else "AVX512"

    def announced(environment: dict) -> list[str]:
        stored.attrs["environment"] = environment
        seal(stored)  # as computed there
        capsys.readouterr()
        execute(run, store)
        return [line for line in capsys.readouterr().err.splitlines() if "another" in line]

    assert announced({**recorded, "cpu": elsewhere}) == [
        f"train {run.node.key[:12]}: reusing the stored artifact, computed under another "
        f"environment: CPU capability {elsewhere} (now CPU capability {here})"
    ]
    # stored before fedhet recorded it: nothing known differs
    assert announced({k: v for k, v in recorded.items() if k != "cpu"}) == []


def test_report_lists_environments_and_announces_results_from_elsewhere(
    fedhet: CliRunner, tmp_path: Path
):
    spec = write_spec(tmp_path / "env.yaml", {**SPEC, "matrix": {"seed": [0, 1]}})
    store, out = tmp_path / "store", tmp_path / "out"
    assert fedhet("train", spec, store=store).rc == 0
    first, second = runs_of(parse_spec({**SPEC, "matrix": {"seed": [0, 1]}}))
    group = zarr.open_group(ArtifactStore(store).path("train", second.node.key), mode="r+")
    group.attrs["environment"] = {**group.attrs["environment"], "threads": 3}
    seal(group)  # as computed there
    result = fedhet("report", spec, "--out", out, store=store)
    assert result.rc == 0, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "another environment" in line]
    assert line == (
        "1 of 2 runs were computed under another environment: 3 threads (now 1 thread); "
        "the report lists the environments"
    )
    text = (out / "provenance.md").read_text()
    listed = [line for line in text.splitlines() if line.startswith("- fedhet ")]
    assert sorted(listed) == [
        "- " + provenance.summary({**group.attrs["environment"], "threads": t}) + ": 1 run"
        for t in (1, 3)
    ]
    shown = fedhet("artifacts", "show", first.node.key[:12], "--store", store)
    assert shown.rc == 0, shown.stderr
    computed_in = shown.stdout.split("computed in", 1)[1]
    assert f"torch     {torch.__version__}" in computed_in and "threads   1" in computed_in
    assert "device    cpu" in computed_in and f"fedhet    {__version__}" in computed_in
    assert f"cpu       {torch.backends.cpu.get_cpu_capability()}" in computed_in


def test_the_torch_build_is_kept_per_machine_so_reuse_checks_need_no_torch(tmp_path):
    """A command that only reuses stored artifacts compares their torch build and CPU
    instruction set with this machine's without importing torch (seconds), from the cache;
    a forced instruction set is another machine's entry."""
    probe = (
        "import sys, json; from fedhet.core import provenance; "
        "print(json.dumps([provenance.torch_build(), 'torch' in sys.modules]))"
    )

    def run(**extra: str) -> list:
        env = {**os.environ, "FEDHET_CACHE": str(tmp_path), **extra}
        done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                              text=True, check=True)  # fmt: skip
        return json.loads(done.stdout)

    first, imported = run()
    assert imported and first["cpu"] == torch.backends.cpu.get_cpu_capability()
    assert run() == [first, False]  # from the cache
    forced, imported = run(ATEN_CPU_CAPABILITY="default")
    assert imported and forced["cpu"] == "DEFAULT"


@pytest.mark.parametrize("continuation", ["recorded", "stored before the record"])
def test_a_run_resumed_in_another_environment_records_where_its_earlier_rounds_ran(
    fedhet: CliRunner, tmp_path: Path, continuation: str
):
    """A run that goes on from a stored shorter run computed under another torch records those
    rounds' environment (a checkpoint's segments: the tests below); the report's header and the
    reuse line say so. A run resumed in its own environment records nothing more."""
    spec = write_spec(tmp_path / "env.yaml", SPEC)
    store, out = tmp_path / "store", tmp_path / "out"
    assert fedhet("train", spec, "federation.rounds=2", store=store).rc == 0
    (short,) = runs_of(parse_spec({**SPEC, "federation": {**SPEC["federation"], "rounds": 2}}))
    group = zarr.open_group(ArtifactStore(store).path("train", short.node.key), mode="r+")
    here = dict(group.attrs["environment"])
    assert "earlier" not in here
    there = {**here, "torch": "2.11.0+cu130", "python": "3.12.3"}
    group.attrs["environment"] = there
    if continuation == "recorded":
        group["continuation"].attrs["environments"] = [{"from_round": 1, "environment": there}]
    else:
        del group["continuation"].attrs["environments"]
    seal(group["continuation"])
    seal(group)  # as computed there

    assert fedhet("train", spec, "federation.rounds=4", store=store).rc == 0
    (long,) = runs_of(parse_spec({**SPEC, "federation": {**SPEC["federation"], "rounds": 4}}))
    env = ArtifactStore(store).attrs("train", long.node.key)["environment"]
    assert env["torch"] == torch.__version__
    ((segment),) = env["earlier"]
    assert segment["rounds"] == [1, 2] and segment["environment"]["torch"] == "2.11.0+cu130"
    summary = provenance.summary(env)
    earlier = summary.split("; earlier ", 1)[1]
    assert earlier.startswith("rounds 1-2 under torch 2.11.0+cu130, CUDA build")
    assert earlier.endswith(", python 3.12.3")  # what differed there, and only that

    result = fedhet("report", spec, "federation.rounds=4", "--out", out, store=store)
    assert result.rc == 0, result.stderr
    assert f"- {summary}: 1 run" in (out / "provenance.md").read_text()
    (line,) = [line for line in result.stderr.splitlines() if "another environment" in line]
    assert f"rounds 1-2: torch 2.11.0+cu130 (now torch {torch.__version__})" in line

    # going on in the same environment adds no segment: 4 -> 6 rounds here
    assert fedhet("train", spec, "federation.rounds=6", store=store).rc == 0
    (longer,) = runs_of(parse_spec({**SPEC, "federation": {**SPEC["federation"], "rounds": 6}}))
    assert ArtifactStore(store).attrs("train", longer.node.key)["environment"]["earlier"] == [
        segment
    ]


def test_segments_follow_a_run_across_environments_and_unrecorded_checkpoints():
    here = provenance.environment()
    there = {**here, "torch": "2.11.0"}
    assert provenance.segments_after([], 0, here) == [{"from_round": 1, "environment": here}]
    ran_there = provenance.segments_after([], 0, there)
    assert provenance.segments_after(ran_there, 5, {**there, "python": "3.13"}) == ran_there
    moved = provenance.segments_after(ran_there, 5, here)
    assert moved == [*ran_there, {"from_round": 6, "environment": here}]
    # a checkpoint written before the record: its rounds' environment is unknown
    unknown = provenance.segments_after([], 3, here)
    assert unknown == [
        {"from_round": 1, "environment": None},
        {"from_round": 4, "environment": here},
    ]
    stored = {**here, **provenance.earlier_of(moved)}
    assert stored["earlier"] == [{"rounds": [1, 5], "environment": there}]
    assert provenance.segments_of(stored) == moved  # a longer run goes on from it
    assert provenance.earlier_of(provenance.segments_after([], 0, here)) == {}
    text = provenance.described({**here, **provenance.earlier_of(unknown)})["earlier"]
    assert text == "rounds 1-3 in an environment not recorded"


def test_a_run_back_in_its_environment_names_only_the_rounds_that_ran_elsewhere():
    here = provenance.environment()
    there = {**here, "torch": "2.11.0"}
    segments = provenance.segments_after([], 0, here)
    segments = provenance.segments_after(segments, 10, there)
    segments = provenance.segments_after(segments, 20, here)
    env = {**here, **provenance.earlier_of(segments)}
    assert [e["rounds"] for e in env["earlier"]] == [[1, 10], [11, 20]]
    assert provenance.described(env)["earlier"].startswith("rounds 11-20 under torch 2.11.0")
    assert "rounds 1-10" not in provenance.summary(env)


def test_a_checkpoint_before_a_continuations_first_round_drops_that_rounds_segment():
    """A run continuing a stored 10-round run in `there` records `there` from round 11; stopped
    in round 11, it leaves a checkpoint of round 10 holding that segment, and resumed here it
    must not claim rounds 11-10 ran there."""
    here = provenance.environment()
    there = {**here, "torch": "2.11.0"}
    continued = provenance.segments_after([{"from_round": 1, "environment": here}], 10, there)
    assert provenance.segments_after(continued, 10, here) == [
        {"from_round": 1, "environment": here}
    ]
    moved = provenance.segments_after(continued, 10, {**here, "threads": 7})
    assert [s["from_round"] for s in moved] == [1, 11]
    assert provenance.earlier_of(moved) == {"earlier": [{"rounds": [1, 10], "environment": here}]}


def test_rounds_of_an_unrecorded_environment_are_not_announced_as_another():
    runtime = parse_spec(SPEC).runtime
    now = provenance.planned_environment(runtime.threads, runtime.device, runtime.clients)
    unknown = provenance.segments_after([], 3, now)  # a checkpoint from before the record
    stored = {**now, **provenance.earlier_of(unknown)}
    assert provenance.changes(stored, runtime) == []  # differs in nothing known
    assert "rounds 1-3 in an environment not recorded" in provenance.summary(stored)
    elsewhere = {**now, "earlier": [{"rounds": [1, 3], "environment": {**now, "torch": "2.11.0"}}]}
    assert provenance.changes(elsewhere, runtime) == [
        f"rounds 1-3: torch 2.11.0 (now torch {now['torch']})"
    ]


def test_a_checkpoint_keeps_the_environments_of_its_rounds(tmp_path):
    from fedhet.engine.run_format import Checkpoints, RunState

    segments = provenance.segments_after([], 0, {"torch": "2.11.0"})
    state = RunState(2, {"w": torch.ones(2)}, {}, {}, environments=segments)
    Checkpoints(tmp_path).save(state)
    assert Checkpoints(tmp_path).latest().environments == segments
