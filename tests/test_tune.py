"""`fedhet tune`: the example of docs/how-to/tune.md runs as written, selection never reads the
test split, trials are ordinary runs (reused by a second or larger tune, computed once when
shared), the choices do not depend on --jobs, budgets are equal unless the spec says otherwise,
and bad input exits 2 in one line."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import REPO, CliRunner, cli_env, write_spec
from rich.console import Console
from test_docs_code import copy_of_the_repository, stray_changes

from fedhet import load as fedhet_load
from fedhet.core.spec import parse_spec
from fedhet.core.store import ArtifactStore
from fedhet.data import datasets, digits
from fedhet.execution.planning import runs_of
from fedhet.execution.train import Options
from fedhet.tuning.groups import tune_groups
from fedhet.tuning.runner import tune

TUNE_SPEC: dict[str, Any] = {
    "name": "tiny-tune",
    "data": {"dataset": "digits", "validation": 0.2},
    "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.5},
    "model": {"arch": "mlp", "hidden": [16]},
    "federation": {"rounds": 3, "batch_size": 32, "lr": 0.05},
    "runtime": {"threads": 1, "progress": False},
    "matrix": {"algorithm": [{"name": "fedavg"}, {"name": "scaffold"}], "seed": [0]},
    "tune": {"trials": 2, "seeds": [7], "space": {"federation.lr": {"grid": [0.05, 0.2]}}},
}


def tune_spec(tmp_path: Path, name: str = "tiny.yaml", **tune: Any) -> Path:
    spec = copy.deepcopy(TUNE_SPEC)
    spec["tune"].update(tune)
    return write_spec(tmp_path / name, spec)


def test_a_trial_is_the_ordinary_run_and_a_tune_section_changes_no_key():
    spec = parse_spec(copy.deepcopy(TUNE_SPEC))
    plain = copy.deepcopy(TUNE_SPEC)
    del plain["tune"]
    assert _keys(spec) == _keys(parse_spec(plain))
    group = tune_groups(spec, spec.tune)[1]  # scaffold's
    trial = group.trial_runs(1, {"federation.lr": 0.2}, [7])[0]
    by_hand = {**plain, "federation": {**plain["federation"], "lr": 0.2}}
    by_hand["matrix"] = {"algorithm": [{"name": "scaffold"}], "seed": [7]}
    assert [node.key for node in trial.node.walk()] == _keys(parse_spec(by_hand))


def _keys(spec: Any) -> list[str]:
    return [node.key for run in runs_of(spec) for node in run.node.walk()]


def docs_commands() -> list[str]:
    text = (REPO / "docs/how-to/tune.md").read_text()
    section = text.split("<!-- tune:start -->")[1].split("<!-- tune:end -->")[0]
    block = re.findall(r"```bash\n(.*?)```", section, flags=re.S)[0]
    return [line for line in block.splitlines() if line.strip()]


@pytest.mark.slow
def test_the_docs_example_runs_as_written(fedhet: CliRunner, tmp_path: Path):
    """From the root of a copy of the repository, as the page says; `git status` there shows
    no committed file changed."""
    folder = copy_of_the_repository(tmp_path / "repository")
    env = cli_env()
    env.pop("FEDHET_STORE", None)  # ./artifacts of the folder, as for a reader
    results = {}
    for line in docs_commands():
        program, *args = shlex.split(line, comments=True)
        assert program == "fedhet", line
        results[args[0] + (" --trials" if "--trials" in args else "")] = result = fedhet(
            *args, env=env, cwd=folder
        )
        assert result.rc == 0, f"{line}\n{result.stderr}"
    assert "valid (9 runs)" in results["spec"].stdout
    assert "14 stages: 14 missing" in results["plan"].stdout  # 12 trials, a partition, the outcome
    assert results["tune"].stdout.count("alpha=0.1") == 3  # a choice per method
    again = results["tune --trials"]
    assert "computing" not in again.stderr and "reusing the stored artifact" in again.stderr
    assert again.stdout.count("yes") == 3  # the chosen trial of each method
    # piped (as here), the trials' table keeps every cell whole: issue 44's "centralize / d"
    trials = [[c.strip() for c in line.split("│")[1:-1]] for line in again.stdout.splitlines()]
    values = {row[3] for row in trials if row and row[0] == "FedProx"}
    assert values == {"lr=0.1, mu=0.01", "lr=0.1, mu=0.1", "lr=0.3, mu=0.01", "lr=0.3, mu=0.1"}
    report = (folder / "report" / "tune_digits_tuned.md").read_text()
    assert "## Tuning" in report and "4 trials per method, the same for every method" in report
    assert "## Paired differences against FedAvg" in report
    assert stray_changes(folder) == []


def _permuted_test_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    original = digits.read

    def permuted(*args: Any) -> Any:
        raw = original(*args)
        order = torch.randperm(len(raw.test_labels), generator=torch.Generator().manual_seed(0))
        return dataclasses.replace(raw, test_labels=raw.test_labels[order.numpy()])

    monkeypatch.setattr(digits, "read", permuted)


def _tuned(root: Path) -> tuple[list[tuple[Any, ...]], ArtifactStore]:
    datasets._load_cached.cache_clear()
    spec, store = parse_spec(copy.deepcopy(TUNE_SPEC)), ArtifactStore(root)
    quiet = Console(file=io.StringIO())
    outcome = tune(spec, spec.tune, store, Options(), lambda runs: None, quiet)
    datasets._load_cached.cache_clear()
    choices = [
        (s.algorithm, s.values, [(t.values, t.scores) for t in s.trials])
        for s in outcome.selections
    ]
    return choices, store


def test_permuting_the_test_labels_changes_no_selection(tmp_path, monkeypatch):
    plain, store = _tuned(tmp_path / "plain")
    _permuted_test_labels(monkeypatch)
    permuted, permuted_store = _tuned(tmp_path / "permuted")
    assert plain == permuted  # the same trials, validation scores and choices
    assert _final_test_accuracies(store) != _final_test_accuracies(permuted_store)


def _final_test_accuracies(store: ArtifactStore) -> dict[str, float]:
    return {
        info.key: float(store.open("train", info.key)["metrics"]["test_accuracy"][-1])
        for info in store.ls()
        if info.stage == "train"
    }


def test_a_second_or_larger_tune_reuses_every_trial(fedhet: CliRunner, tmp_path):
    store = tmp_path / "store"
    small = tune_spec(tmp_path, "small.yaml", trials=1, space={"federation.lr": {"grid": [0.2]}})
    first = fedhet("tune", small, store=store)
    assert first.rc == 0, first.stderr
    assert first.stderr.count("computing") == 3  # a partition, a trial run per method
    larger = fedhet("tune", tune_spec(tmp_path), store=store)
    assert larger.rc == 0, larger.stderr
    assert "tune: 4 trial runs, 2 not stored" in larger.stderr  # lr 0.2's are reused
    assert larger.stderr.count("computing") == 2
    again = fedhet("tune", tune_spec(tmp_path), "--trials", store=store)
    assert "computing" not in again.stderr and "reusing the stored artifact" in again.stderr
    assert again.stdout.count("yes") == 2
    plan = fedhet("plan", tune_spec(tmp_path), "--tune", store=store)
    assert "6 stages: 6 stored; nothing left to run" in plan.stdout  # the tune's outcome too
    # a trial shared by two methods' grids (here: a repeated point) is one run
    twice = tune_spec(tmp_path, "twice.yaml", space={"federation.lr": {"grid": [0.3, 0.3]}})
    shared = fedhet("tune", twice, store=store)
    assert shared.rc == 0, shared.stderr
    assert "tune: 4 trial runs, 2 not stored" in shared.stderr


def test_a_tune_of_fewer_rows_is_read_from_the_trials_of_a_wider_one(fedhet: CliRunner, tmp_path):
    """`report --tuned --only` after a tune of every row needs no tune of its own: its choices
    are those the narrower tune computes (the same report after it is stored). Without the
    trials it refuses in one line."""
    store, spec, only = tmp_path / "store", tune_spec(tmp_path), ("--only", "algorithm=scaffold")
    refused = fedhet("report", spec, "--tuned", *only, store=store)
    assert refused.rc == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "is not stored" in refused.stderr and "run `fedhet tune" in refused.stderr
    assert fedhet("tune", spec, store=store).rc == 0

    def report(out: str) -> str:
        folder = tmp_path / out
        result = fedhet("report", spec, "--tuned", *only, "--train", "--out", folder, store=store)
        assert result.rc == 0, result.stderr
        return (folder / "tiny-tune_tuned.md").read_text()

    derived = report("derived")
    narrow = fedhet("tune", spec, *only, store=store)
    assert "tune: 2 trial runs, 0 not stored" in narrow.stderr  # stored now, nothing trained
    assert "SCAFFOLD" in derived and "FedAvg" not in derived.split("## Tuning")[1]
    assert derived == report("stored")


def test_plan_tune_shows_a_damaged_tune_outcome_as_artifacts_verify_does(
    fedhet: CliRunner, tmp_path, capsys
):
    store = tmp_path / "store"
    spec = tune_spec(tmp_path, trials=1, space={"federation.lr": {"grid": [0.2]}})
    assert fedhet("tune", spec, store=store).rc == 0
    (outcome,) = (store / "tune").glob("*.zarr")
    key = outcome.name.removesuffix(".zarr")
    metadata = outcome / "zarr.json"  # an attribute changed behind the store's back
    metadata.write_text(metadata.read_text().replace('"best_val"', '"final_val"', 1))
    verified = fedhet("artifacts", "verify", key[:12], store=store)
    assert verified.rc == 1 and "zarr.json: its attributes fail their checksum" in verified.stdout
    plan = fedhet("plan", spec, "--tune", "--format", "json", store=store)
    assert plan.rc == 0, plan.stderr
    rows = json.loads(plan.stdout)
    assert [r["stage"] for r in rows] == ["partition", "train", "train", "tune"]
    assert rows[-1]["key"] == key[:10]
    assert rows[-1]["state"] == "damaged: zarr.json: its attributes fail their checksum"
    (line,) = plan.stderr.strip().splitlines()
    assert line.startswith(f"warning: tune/{key[:12]} is damaged: zarr.json: its attributes")
    assert line.endswith(
        f"`fedhet artifacts rm {key[:12]}`, then `fedhet tune {spec}` recomputes it"
    )
    table = fedhet("plan", spec, "--tune", store=store)
    assert "4 stages: 3 stored, 1 damaged; no time estimate" in " ".join(table.stdout.split())
    assert "nothing left to run" not in table.stdout and "Traceback" not in table.stderr
    # fedhet.load(...).plan(tune=True): the same rows, the remedy a call to make
    frame = fedhet_load(spec, store=store).plan(tune=True)
    assert frame["state"].iloc[-1] == rows[-1]["state"]
    assert frame.attrs["summary"] == "4 stages: 3 stored, 1 damaged; no time estimate"
    (line,) = capsys.readouterr().err.strip().splitlines()
    call = f"fedhet.load({str(spec)!r}, store={str(store)!r})"
    assert line.endswith(
        f"`fedhet.artifacts({str(store)!r}).rm({key[:12]!r})`, then `{call}.tune()` recomputes it"
    )


def test_the_choices_do_not_depend_on_jobs(fedhet: CliRunner, tmp_path):
    spec = tune_spec(
        tmp_path,
        trials=2,
        batch=2,  # one wave: a pool of workers each
        sampler="tpe",
        space={"federation.lr": {"log_uniform": [0.02, 0.5]}},
    )
    outputs = []
    for jobs in ([], ["--jobs", "2"]):
        store = tmp_path / f"store{len(jobs)}"
        result = fedhet("tune", spec, "--trials", "--format", "json", *jobs, store=store)
        assert result.rc == 0, result.stderr
        outputs.append(json.loads(result.stdout))
    assert outputs[0] == outputs[1] and len(outputs[0]) == 4


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"data": {"dataset": "digits"}},
            "data.validation: a tune selects on the validation split, never the test split; "
            "set data.validation, e.g. 0.2",
        ),
        (
            {"tune": {"trials": 3}},
            "tune.trials: fedavg's grid has 2 points for a budget of 3 trials; every method gets "
            "the same budget: make its grid 3 points, or give fedavg its own "
            "(tune.methods.fedavg.trials: 2, an unequal budget the report states)",
        ),
        (
            {"tune": {"space": {"algorithm.mu": {"grid": [0.01, 0.1]}}}},
            "tune.space.algorithm.mu: 0.01 gives an invalid fedavg run: algorithm.mu: applies to "
            "algorithm fedbr, fedprox, moon only; remove it or set algorithm.name",
        ),
        (
            {"tune": {"space": {"seed": {"grid": [1, 2]}}}},
            "tune.space: seed: a tune searches the fields of model, federation, algorithm",
        ),
        (
            {"tune": {"space": {"federation.lr": {"choice": [0.1, 0.2]}}, "sampler": "grid"}},
            "tune.space.federation.lr: the grid sampler takes grids only",
        ),
        (
            {"tune": {"methods": {"fedprx": {"trials": 2}}}},
            "tune.methods.fedprx: no such algorithm; name one of the spec's: fedavg, scaffold",
        ),
        (
            {"matrix": {"federation.lr": [0.1, 0.2]}},
            "tune.space.federation.lr: the matrix sweeps federation.lr; tune it or sweep it",
        ),
    ],
)
def test_a_tune_that_cannot_be_fair_is_refused_in_one_line(fedhet, tmp_path, changes, message):
    spec = copy.deepcopy(TUNE_SPEC)
    for section, fields in changes.items():
        spec[section] = {**spec[section], **fields} if section != "data" else fields
    result = fedhet("spec", "validate", write_spec(tmp_path / "bad.yaml", spec))
    assert result.rc == 2
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert message in result.stderr, result.stderr


def test_an_unequal_budget_is_the_specs_choice_and_the_report_says_so(fedhet, tmp_path):
    spec = tune_spec(
        tmp_path,
        trials=1,
        space={"federation.lr": {"grid": [0.2]}},
        methods={"scaffold": {"trials": 2, "space": {"federation.lr": {"grid": [0.05, 0.2]}}}},
    )
    store = tmp_path / "store"
    missing = fedhet("report", spec, "--tuned", "--out", tmp_path, store=store)
    assert missing.rc == 2
    assert f"the tune of {spec} is not stored" in missing.stderr
    assert f"run `fedhet tune {spec}` first" in missing.stderr
    assert fedhet("tune", spec, store=store).rc == 0
    untrained = fedhet("report", spec, "--tuned", "--out", tmp_path, store=store)
    assert untrained.rc == 2 and "2 of 2 runs of the chosen configurations" in untrained.stderr
    report = fedhet("report", spec, "--tuned", "--train", "--out", tmp_path, store=store)
    assert report.rc == 0, report.stderr
    text = (tmp_path / "tiny-tune_tuned.md").read_text()
    assert "1 trials per method, except by the spec's choice: scaffold 2" in text


def test_tune_needs_a_tune_section(fedhet, tmp_path):
    spec = copy.deepcopy(TUNE_SPEC)
    del spec["tune"]
    result = fedhet("tune", write_spec(tmp_path / "plain.yaml", spec), store=tmp_path)
    assert result.rc == 2
    assert result.stderr.startswith(f"error: {tmp_path / 'plain.yaml'}: no tune section; add one")


def test_trials_stopped_early_are_recorded_and_a_rerun_stops_the_same(fedhet, tmp_path):
    spec = copy.deepcopy(TUNE_SPEC)
    spec["federation"]["rounds"] = 4
    spec["matrix"]["algorithm"] = [{"name": "fedavg"}]
    spec["tune"].update(
        trials=4,
        batch=2,
        space={"federation.lr": {"grid": [0.2, 0.1, 0.005, 0.002]}},
        prune={"rungs": [2], "startup_trials": 2},
    )
    path, store = write_spec(tmp_path / "pruned.yaml", spec), tmp_path / "store"
    first = fedhet("tune", path, "--trials", "--format", "json", store=store)
    assert first.rc == 0, first.stderr
    trials = json.loads(first.stdout)
    stopped = [t for t in trials if t["pruned_at"] is not None]
    assert [t["pruned_at"] for t in stopped] == [2, 2]  # the small learning rates, at round 2
    assert not any(t["chosen"] for t in stopped)
    runs = {
        info.key: info.attrs["config"]["federation"]["rounds"]
        for info in ArtifactStore(store).ls()
        if info.stage == "train"
    }
    for trial in stopped:  # its 2-round run is stored, and no longer one
        assert runs[next(k for k in runs if k.startswith(trial["keys"]))] == 2
    assert sorted(runs.values()) == [2, 2, 2, 2, 4, 4]  # the others continued their rung runs
    again = fedhet("tune", path, "--trials", "--format", "json", store=store)
    assert json.loads(again.stdout) == trials and "computing" not in again.stderr
    ArtifactStore(store).remove(next(a for a in ArtifactStore(store).ls() if a.stage == "tune"))
    replayed = fedhet("tune", path, "--trials", "--format", "json", store=store)
    assert json.loads(replayed.stdout) == trials and "computing" not in replayed.stderr
