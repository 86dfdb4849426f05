"""The command line and `fedhet.load` do their work through one session (fedhet.session), and
`fedhet artifacts` and `fedhet.artifacts` through one store session (fedhet.store_session), so
they refuse the same inputs with the same one-line message: the command line prints it after
`error: ` (exit 2, no traceback), the Python API raises it as InputError. Where a message names
what the caller can change or do next, each speaks its own language: options and commands on the
command line, arguments and calls in Python. And what one prints, the other returns."""

from __future__ import annotations

import json
import re
import shutil
from itertools import groupby
from pathlib import Path

import pytest
import yaml
from conftest import TINY_SPEC, CliRunner, flip_a_byte, write_spec

from fedhet import artifacts, load
from fedhet.core.errors import InputError
from fedhet.core.store import ArtifactStore

ARRAYS = {"dataset": "arrays", "path": "missing.npz"}
FEDERATION = TINY_SPEC["federation"]

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
    "an unknown field": ({"federation": {**FEDERATION, "bogus": 1}}, [], "bogus"),
    "a bad type": (
        {"federation": {**FEDERATION, "lr": "fast"}},
        [],
        "federation.lr: input should be a valid number",
    ),
    "a boolean count": (
        {"federation": {**FEDERATION, "rounds": True}},
        [],
        "federation.rounds: input should be a valid integer (got True)",
    ),
    "an unknown method": (
        {"algorithm": {"name": "fedmagic"}},
        [],
        "algorithm.name: unknown or missing algorithm; choose one of",
    ),
    "an unknown dataset": ({"data": {"dataset": "nosuch"}}, [], "data.dataset: unknown value"),
    "a bad override": ({}, ["federation.rounds=true"], "federation.rounds"),
    "an override of no field": ({}, ["federation.speed=2"], "federation.speed"),
    "a missing data file": ({"data": ARRAYS}, [], "missing.npz"),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_the_api_and_the_command_line_refuse_the_same_spec_with_the_same_line(
    fedhet: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
):
    changes, overrides, named = BAD_SPECS[case]
    write_spec(tmp_path / "bad.yaml", TINY_SPEC | changes)
    store = tmp_path / "store"
    lines = set()
    for command in (["spec", "validate"], ["spec", "show"], ["spec", "hash"], ["train"]):
        result = fedhet(*command, "bad.yaml", *overrides, store=store, cwd=tmp_path)
        assert result.rc == 2 and "Traceback" not in result.stderr, result.stderr
        (line,) = result.stderr.strip("\n").splitlines()
        lines.add(same_machine(line))

    monkeypatch.chdir(tmp_path)
    for call in (
        lambda: load("bad.yaml", *overrides, store=store),
        lambda: load("bad.yaml", *overrides, store=store).show(),
        lambda: load("bad.yaml", *overrides, store=store).keys(),
        lambda: train(overrides, store),
    ):
        with pytest.raises(InputError) as refused:
            call()
        lines.add(same_machine(f"error: {refused.value}"))
    (line,) = lines  # one message, from all eight
    assert named in line
    assert not store.exists()


def train(overrides: list[str], store: Path) -> None:
    load("bad.yaml", *overrides, store=store).train()


def test_a_spec_both_accept_loads_the_same(fedhet: CliRunner, tmp_path: Path, monkeypatch):
    """The control: with the changes undone, both accept the spec (the same runs)."""
    write_spec(tmp_path / "good.yaml", TINY_SPEC)
    result = fedhet("spec", "validate", "good.yaml", "seed=4", cwd=tmp_path)
    assert (result.rc, result.stdout) == (0, "good.yaml: valid (1 run)\n"), result.stderr
    monkeypatch.chdir(tmp_path)
    experiment = load("good.yaml", "seed=4", store=tmp_path / "store")
    assert experiment.spec.seed == 4 and len(experiment.runs()) == 1


TWO_ALGORITHMS = TINY_SPEC | {
    "data": {"dataset": "digits", "validation": 0.2},
    "matrix": {"algorithm": [{"name": "fedavg"}, {"name": "fedprox", "mu": 0.01}]},
    "tune": {"trials": 1, "seeds": [7], "space": {"federation.lr": {"grid": [0.05]}}},
}
CALL = "fedhet.load('two.yaml', 'seed=5', store='{store}')"

# (command-line arguments, the Experiment call, the command line's words, Python's words)
REFUSALS = {
    "no worker": (
        ["train", "--jobs", "0"],
        lambda e: e.train(jobs=0),
        "--jobs 0: give at least 1 worker process",
        "jobs=0: give at least 1 worker process",
    ),
    "an unknown baseline": (
        ["report", "--baseline", "nosuch"],
        lambda e: e.compare(baseline="nosuch"),
        "--baseline 'nosuch' is no algorithm of this report",
        "baseline='nosuch' is no algorithm of this report",
    ),
    "runs not stored": (
        ["eval"],
        lambda e: e.evaluate(),
        "run `fedhet train two.yaml seed=5 --store {store}` first or pass --train",
        f"call `{CALL}.train()` first or pass evaluate(train=True)",
    ),
    "a tune not stored": (
        ["report", "--tuned"],
        lambda e: e.report(tuned=True),
        "the tune of two.yaml is not stored (tune ",
        "the tune of two.yaml is not stored (tune ",
    ),
    "how to store a tune": (
        ["report", "--tuned"],
        lambda e: e.report(tuned=True),
        "; run `fedhet tune two.yaml seed=5 --store {store}` first",
        f"; call `{CALL}.tune()` first",
    ),
    "an unwritable TensorBoard folder": (
        ["export", "--tensorboard", "two.yaml/events"],
        lambda e: e.metrics(tensorboard="two.yaml/events"),
        "--tensorboard: cannot write TensorBoard events under two.yaml/events",
        "tensorboard: cannot write TensorBoard events under two.yaml/events",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_each_refuses_in_its_own_words(
    fedhet: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
):
    arguments, call, command_line, python = REFUSALS[case]
    write_spec(tmp_path / "two.yaml", TWO_ALGORITHMS)
    store = tmp_path / "store"
    command, *options = arguments
    result = fedhet(command, "two.yaml", "seed=5", *options, "--store", store, cwd=tmp_path)
    assert result.rc == 2 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip("\n").splitlines()
    assert command_line.format(store=store) in line

    monkeypatch.chdir(tmp_path)
    experiment = load("two.yaml", "seed=5", store=store)
    with pytest.raises(InputError) as refused:
        call(experiment)
    message = str(refused.value)
    assert python.format(store=store) in message
    assert "--" not in message and "`fedhet " not in message  # no option, no command
    assert not store.exists()  # a refusal computes nothing


def test_tuned_runs_not_stored_are_refused_with_the_call_that_computes_them(
    fedhet: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    write_spec(tmp_path / "two.yaml", TWO_ALGORITHMS)
    store = tmp_path / "store"
    assert fedhet("tune", "two.yaml", "seed=5", "--store", store, cwd=tmp_path).rc == 0
    result = fedhet("report", "two.yaml", "seed=5", "--tuned", "--store", store, cwd=tmp_path)
    assert result.rc == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.rstrip().endswith(
        f"compute them with `fedhet report two.yaml seed=5 --tuned --train --store {store}`"
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as refused:
        load("two.yaml", "seed=5", store=store).report(tuned=True)
    call = CALL.format(store=store)
    assert str(refused.value).endswith(f"compute them with `{call}.report(tuned=True, train=True)`")


def test_an_unwritable_store_is_named_in_each_ones_words(
    fedhet: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    write_spec(tmp_path / "two.yaml", TWO_ALGORITHMS)
    store = "/proc/fedhet-store"  # worker processes could not write their results there
    result = fedhet("train", "two.yaml", "--jobs", "2", "--store", store, cwd=tmp_path)
    assert result.rc == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"error: --store {store}: not writable")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=f"^store {store}: not writable"):
        load("two.yaml", store=store).train(jobs=2)


def same_machine(message: str) -> str:
    """The message less the memory this machine has free, which changes from call to call."""
    return re.sub(r"[\d,.]+ GiB this machine", "N GiB this machine", message)


# --- the store: `fedhet artifacts` and `fedhet.artifacts` ------------------------------------


@pytest.fixture(scope="module")
def stored(fedhet: CliRunner, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with tiny.yaml (TINY_SPEC for one round) and store/, its partition and run."""
    root = tmp_path_factory.mktemp("stored")
    write_spec(root / "tiny.yaml", TINY_SPEC | {"federation": FEDERATION | {"rounds": 1}})
    write_spec(root / "bad.yaml", TINY_SPEC | {"federation": FEDERATION | {"bogus": 1}})
    trained = fedhet("train", "tiny.yaml", "--store", root / "store", cwd=root)
    assert trained.rc == 0, trained.stderr
    return root


def partition_key(store: Path) -> str:
    (partition,) = (a for a in ArtifactStore(store).ls() if a.stage == "partition")
    return partition.key[:10]


# (`fedhet artifacts` arguments, the `fedhet.artifacts(store)` call, what both say, or what the
# command line and Python each say); {partition}: the stored partition's key prefix
STORE_REFUSALS = {
    "show of no such key": (
        ["show", "zzz"],
        lambda a, _: a.show("zzz"),
        "no artifact key starts with 'zzz' in {store}",
    ),
    "verify of no such key": (
        ["verify", "zzz"],
        lambda a, _: a.verify("zzz"),
        "no artifact key starts with 'zzz' in {store}",
    ),
    "rm of no such key": (
        ["rm", "zzz"],
        lambda a, _: a.rm("zzz"),
        "no artifact key starts with 'zzz' in {store}",
    ),
    "an ambiguous prefix": (
        ["show", ""],
        lambda a, _: a.show(""),
        "key prefix '' is ambiguous (partition/",
    ),
    "ls of a refused spec": (
        ["ls", "--spec", "bad.yaml"],
        lambda a, _: a.ls(spec="bad.yaml"),
        "federation.bogus",
    ),
    "rm of what a run is built on": (
        ["rm", "{partition}"],
        lambda a, partition: a.rm(partition),
        "depends on it; remove those too with --cascade, or leave it",
        "depends on it; remove those too with cascade=True, or leave it",
    ),
    "a negative grace": (
        ["gc", "--grace", "-1"],
        lambda a, _: a.gc(grace=-1.0),
        "--grace -1.0: give 0 seconds or more",
        "grace=-1.0: give 0 seconds or more",
    ),
}


@pytest.mark.parametrize("case", sorted(STORE_REFUSALS))
def test_the_store_commands_and_the_api_refuse_alike(
    fedhet: CliRunner, stored: Path, monkeypatch: pytest.MonkeyPatch, case: str
):
    arguments, call, *words = STORE_REFUSALS[case]
    store, partition = stored / "store", partition_key(stored / "store")
    held = ArtifactStore(store).ls()
    arguments = [a.format(partition=partition) for a in arguments]
    result = fedhet("artifacts", *arguments, "--store", store, cwd=stored)
    assert result.rc == 2 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip("\n").splitlines()

    monkeypatch.chdir(stored)
    with pytest.raises(InputError) as refused:
        call(artifacts(store), partition)
    command_line, python = (words * 2)[:2]
    assert command_line.format(store=store) in line
    assert python.format(store=store) in str(refused.value)
    if len(words) == 1:  # nothing to name in each one's words: the very same line
        assert line == f"error: {refused.value}"
    else:
        assert "--" not in str(refused.value)
    assert ArtifactStore(store).ls() == held  # a refusal removes nothing


def test_a_store_url_refused_alike(fedhet: CliRunner, tmp_path: Path):
    url = "ftp://host/fedhet"
    result = fedhet("artifacts", "ls", "--store", url, cwd=tmp_path)
    assert result.rc == 2, result.stderr
    with pytest.raises(InputError) as refused:
        artifacts(url)
    assert result.stderr == f"error: {refused.value}\n"
    assert "unsupported scheme" in result.stderr


def test_the_api_returns_what_the_command_line_prints(
    fedhet: CliRunner, stored: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """spec hash and show, artifacts ls and a damaged store's verify: the same data both ways."""
    monkeypatch.chdir(stored)
    store = tmp_path / "store"
    shutil.copytree(stored / "store", store)
    experiment, shelf = load("tiny.yaml", "seed=4", store=store), artifacts(store)

    hashed = fedhet("spec", "hash", "tiny.yaml", "seed=4", cwd=stored)
    lines = []
    for _, run in groupby(experiment.keys().itertuples(), key=lambda row: row.run):
        rows = list(run)
        lines += [f"# {rows[0].label}", *(f"{r.stage:10s} {r.key}" for r in rows)]
    assert hashed.rc == 0 and hashed.stdout.splitlines() == lines

    shown = fedhet("spec", "show", "tiny.yaml", "seed=4", cwd=stored)
    yaml_text, _, split_points = shown.stdout.rpartition("# model split points: ")
    assert yaml.safe_load(yaml_text) == experiment.show()
    assert split_points.strip() == ", ".join(experiment.spec.model.split_points())

    listed = fedhet("artifacts", "ls", "--format", "json", "--store", store, cwd=stored)
    columns = ["stage", "key", "label", "size", "created"]
    assert json.loads(listed.stdout) == shelf.ls()[columns].to_dict("records")

    (train,) = (a for a in ArtifactStore(store).ls() if a.stage == "train")
    flip_a_byte(train.path / "model" / "final" / "head.weight")
    verified = fedhet("artifacts", "verify", "--store", store, cwd=stored)
    assert verified.rc == 1 and verified.stderr == "error: 1 corrupt artifact\n"
    found = shelf.verify()
    assert verified.stdout.splitlines() == [
        f"{row.stage}/{row.key[:12]}: {row.status}" for row in found.itertuples()
    ]
    assert [bool(p) for p in found.problems] == [False, True]  # partition ok, train damaged
