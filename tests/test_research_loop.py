"""The research loop through the installed CLI: overrides on the command line, `plan`, `runs`,
`artifacts ls/rm/gc --dry-run`, every table's formats and width, `spec show` and the schema's
names, and an example in every command's --help."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
import zarr
from conftest import CliRunner, cli_env

from fedhet.core.spec import json_schema, load_spec
from fedhet.core.store import ArtifactInfo, ArtifactStore
from fedhet.execution.planning import runs_of
from fedhet.reports.status import Estimator, StageState

SPEC = {
    "name": "loop",
    "seed": 0,
    "data": {"dataset": "digits"},
    "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.5},
    "model": {"arch": "mlp", "hidden": [16]},
    "federation": {"rounds": 2, "batch_size": 64, "lr": 0.05},
    "algorithm": {"name": "fedavg"},
    "runtime": {"threads": 1, "progress": False, "device": "cpu"},
}


def write(path: Path, **changes) -> Path:
    path.write_text(yaml.safe_dump({**SPEC, **changes}, sort_keys=False))
    return path


def hashes(result) -> list[str]:
    assert result.rc == 0, result.stderr
    return re.findall(r"\b[0-9a-f]{64}\b", result.stdout)


# --- 1. overrides ---------------------------------------------------------------------------


def test_overrides_give_the_keys_of_an_edited_file(fedhet: CliRunner, tmp_path: Path):
    base = write(tmp_path / "base.yaml")
    edited = write(
        tmp_path / "edited.yaml",
        federation={**SPEC["federation"], "rounds": 7},
        algorithm={"name": "fedprox", "mu": 0.1},
        partition={"scheme": "iid", "clients": 5},
        matrix={"seed": [0, 1, 2]},
    )
    overridden = fedhet(
        "spec", "hash", base, "federation.rounds=7", "algorithm.name=fedprox",
        "algorithm.mu=0.1", "partition={scheme: iid, clients: 5}", "matrix.seed=[0,1,2]",
    )  # fmt: skip
    assert hashes(overridden) == hashes(fedhet("spec", "hash", edited))
    assert len(set(hashes(overridden))) == 6  # 3 seeds x (partition, train)
    assert hashes(overridden) != hashes(fedhet("spec", "hash", base))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("federation.rounds=abc", "override 'federation.rounds=abc': federation.rounds: "),
        ("federation.roundz=3", "override 'federation.roundz=3': federation.roundz: unknown"),
        ("matrix.sead=[0,1]", "override 'matrix.sead=[0,1]': "),  # matrix takes any axis name
        (
            "algorithm.mu=0.1",
            "override 'algorithm.mu=0.1': algorithm.mu: applies to algorithm fedbr, fedprox, "
            "moon only",
        ),
        ("seed.value=1", "override 'seed.value=1': seed is a value, not a section"),
        ("rounds", "override 'rounds': expected PATH=VALUE"),
        ("seed=[1", "override 'seed=[1': the value is not valid YAML"),
    ],
)
def test_a_bad_override_exits_2_in_one_line_and_writes_nothing(
    fedhet: CliRunner, tmp_path: Path, override: str, message: str
):
    spec, store = write(tmp_path / "s.yaml"), tmp_path / "store"
    result = fedhet("train", spec, override, store=store)
    assert result.rc == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"error: {message}")
    assert "sead" not in message or "sead: unknown field" in result.stderr
    assert not store.exists()


def test_the_artifact_records_the_spec_as_run(fedhet: CliRunner, tmp_path: Path):
    spec, store = write(tmp_path / "s.yaml"), tmp_path / "store"
    result = fedhet("train", spec, "federation.rounds=1", "seed=4", store=store)
    assert result.rc == 0, result.stderr
    (train,) = [a for a in ArtifactStore(store).ls() if a.stage == "train"]
    as_run = train.attrs["spec"]
    assert as_run["federation"]["rounds"] == 1 and as_run["seed"] == 4
    assert as_run["model"]["hidden"] == [16] and train.attrs["label"] == "FedAvg, alpha=0.5, seed 4"


# --- 2./3. plan, runs, artifacts ls/rm/gc ----------------------------------------------------


@pytest.fixture(scope="module")
def trained(fedhet: CliRunner, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Seeds 0 and 1 of a 2-seed x 2-algorithm spec trained; the spec's file asks for 3 seeds."""
    root = tmp_path_factory.mktemp("loop")
    spec = write(root / "loop.yaml", matrix={"algorithm.name": ["fedavg", "scaffold"]})
    store = root / "store"
    result = fedhet("train", spec, "matrix.seed=[0,1]", store=store)
    assert result.rc == 0, result.stderr
    spec.write_text(
        spec.read_text().replace("algorithm.name:", "seed: [0, 1, 2]\n  algorithm.name:")
    )
    return spec, store


def as_json(result) -> list[dict]:
    assert result.rc == 0, result.stderr
    return json.loads(result.stdout)


def test_a_run_stopped_for_a_while_does_not_move_the_estimate(trained: tuple[Path, Path]):
    """A run whose process was stopped (SIGSTOP, a suspended machine) stores a long wall time;
    the estimate is the median of its shape's stored runs, which one such run leaves."""
    spec, store = trained
    infos = [i for i in ArtifactStore(store).ls() if i.stage == "partition" or _is(i, "fedavg")]
    stored_train = [i for i in infos if i.stage == "train"]
    stopped = replace(stored_train[0], key="0" * 64, attrs={**stored_train[0].attrs})
    stopped.attrs["wall_time_s"] = 1000 * stopped.attrs["wall_time_s"]

    class Store:
        def ls(self) -> list[ArtifactInfo]:
            return [*infos, stopped]

    (run,) = [r for r in runs_of(load_spec(spec)) if r.spec.seed == 2 and _is_run(r, "fedavg")]
    missing = StageState(run.node, "missing", None, run.spec.federation.rounds)
    per_run = sorted(i.attrs["wall_time_s"] for i in [*stored_train, stopped])
    assert Estimator(Store()).seconds_left(missing) == pytest.approx(per_run[1])


def _is(info: ArtifactInfo, algorithm: str) -> bool:
    return info.stage == "train" and info.attrs["config"]["algorithm"]["name"] == algorithm


def _is_run(run, algorithm: str) -> bool:
    return run.spec.algorithm.name == algorithm


def test_plan_shows_stored_partial_and_missing_stages_once(
    fedhet: CliRunner, trained: tuple[Path, Path]
):
    spec, store = trained
    missing_fedavg = next(
        r for r in as_json(fedhet("plan", spec, "--format", "json", store=store))
        if r["stage"] == "train" and r["run"] == "FedAvg, alpha=0.5, seed 2"
    )  # fmt: skip
    # a checkpoint after round 1 of 2 in the missing run's partial area
    full_key = _full_key(fedhet, spec, missing_fedavg["key"])
    ckpt = ArtifactStore(store).partial_dir("train", full_key) / "ckpt-000001.zarr"
    zarr.open_group(ckpt, mode="w").attrs["round"] = 1

    result = fedhet("plan", spec, store=store)
    assert result.rc == 0, result.stderr
    rows = as_json(fedhet("plan", spec, "--format", "json", store=store))
    states = {(r["run"], r["stage"]): r for r in rows}
    assert len(rows) == 3 + 6  # one partition per seed (shared by both algorithms), 6 trainings
    assert {r["state"] for r in rows if "seed 2" not in r["run"]} == {"stored"}
    assert states["FedAvg, alpha=0.5, seed 2", "partition"]["state"] == "missing"
    assert states["FedAvg, alpha=0.5, seed 2", "partition"]["runs"] == 2
    assert states["FedAvg, alpha=0.5, seed 2", "train"]["state"] == "partial (round 1 of 2)"
    assert states["SCAFFOLD, alpha=0.5, seed 2", "train"]["state"] == "missing"
    # estimated from seeds 0 and 1 (same stage and shape): the partial run needs half the time
    partial_left = states["FedAvg, alpha=0.5, seed 2", "train"]["seconds_left"]
    unseen = as_json(fedhet("plan", spec, "matrix.seed=[3]", "--format", "json", store=store))
    full_left = {r["run"].split(",")[0]: r["seconds_left"] for r in unseen if r["stage"] == "train"}
    assert partial_left > 0 and partial_left == pytest.approx(full_left["FedAvg"] / 2)
    assert full_left["SCAFFOLD"] > 0
    assert states["SCAFFOLD, alpha=0.5, seed 2", "train"]["seconds_left"] == full_left["SCAFFOLD"]
    assert "6 stored, 1 partial, 2 missing; about" in result.stdout
    other = as_json(fedhet("plan", spec, "model.hidden=[8]", "--format", "json", store=store))
    assert {r["seconds_left"] for r in other if r["stage"] == "train"} == {None}  # no estimate
    # a partition to compute (timed by the stored ones) and trainings of a shape never stored:
    # the summary says which stages its time covers, not a total that reads as the whole plan's
    mixed = fedhet("plan", spec, "model.hidden=[8]", "matrix.seed=[3]", store=store).stdout
    summary = mixed.splitlines()[-1]
    assert summary.startswith("3 stages: 3 missing; about ") and summary.endswith(
        "s for 1 partition stage; no estimate for 2 train stages "
        "(nothing stored of their shape to time them by)"
    ), mixed
    shutil.rmtree(ckpt.parent)  # the module's later tests train this run for real


def _full_key(fedhet: CliRunner, spec: Path, prefix: str) -> str:
    (key,) = [k for k in hashes(fedhet("spec", "hash", spec)) if k.startswith(prefix)]
    return key


def test_runs_lists_results_and_filters(fedhet: CliRunner, trained: tuple[Path, Path]):
    spec, store = trained
    rows = as_json(fedhet("runs", spec, "--format", "json", store=store))
    assert [(r["algorithm"], r["seed"], r["state"]) for r in rows] == [
        ("FedAvg", 0, "stored"), ("SCAFFOLD", 0, "stored"), ("FedAvg", 1, "stored"),
        ("SCAFFOLD", 1, "stored"), ("FedAvg", 2, rows[4]["state"]), ("SCAFFOLD", 2, "missing"),
    ]  # fmt: skip
    stored = [r for r in rows if r["state"] == "stored"]
    assert all(0 < r["final_pct"] <= r["best_test_pct"] <= 100 for r in stored)
    assert all(r["rounds"] == 2 and r["wall_time_s"] > 0 for r in stored)
    scaffold = as_json(
        fedhet("runs", spec, "--algorithm", "scaffold", "--format", "json", store=store)
    )
    assert [r["seed"] for r in scaffold] == [0, 1, 2]
    missing = as_json(fedhet("runs", spec, "--state", "missing", "--format", "json", store=store))
    assert ("SCAFFOLD", 2) in [(r["algorithm"], r["seed"]) for r in missing]


def test_artifacts_ls_names_runs_by_label_and_filters(
    fedhet: CliRunner, trained: tuple[Path, Path]
):
    spec, store = trained
    rows = as_json(fedhet("artifacts", "ls", "--format", "json", store=store))
    labels = {r["label"] for r in rows if r["stage"] == "train"}
    assert labels == {f"{a}, alpha=0.5, seed {s}" for a in ("FedAvg", "SCAFFOLD") for s in (0, 1)}
    partitions = [r["label"] for r in rows if r["stage"] == "partition"]
    assert sorted(partitions) == [f"digits alpha=0.5, 4 clients, seed {s}" for s in (0, 1)]
    only = as_json(
        fedhet("artifacts", "ls", "--stage", "train", "--algorithm", "scaffold", "--format",
               "json", store=store)
    )  # fmt: skip
    assert {r["label"] for r in only} == {
        "SCAFFOLD, alpha=0.5, seed 0",
        "SCAFFOLD, alpha=0.5, seed 1",
    }
    other = write(spec.with_name("other.yaml"), seed=1)  # seed 1's partition and fedavg run
    mine = as_json(fedhet("artifacts", "ls", "--spec", other, "--format", "json", store=store))
    assert sorted(r["stage"] for r in mine) == ["partition", "train"]


def test_artifacts_rm_refuses_a_depended_on_artifact_unless_cascade(
    fedhet: CliRunner, tmp_path: Path
):
    spec, store = write(tmp_path / "s.yaml"), tmp_path / "store"
    assert fedhet("train", spec, "federation.rounds=1", store=store).rc == 0
    infos = {a.stage: a for a in ArtifactStore(store).ls()}
    refused = fedhet("artifacts", "rm", infos["partition"].key[:10], store=store)
    assert refused.rc == 2 and refused.stderr.count("\n") == 1
    assert f"train/{infos['train'].key[:10]} depends on it" in refused.stderr
    assert "--cascade" in refused.stderr
    assert len(ArtifactStore(store).ls()) == 2
    train_only = fedhet("artifacts", "rm", infos["train"].key, store=store)
    assert train_only.rc == 0 and [a.stage for a in ArtifactStore(store).ls()] == ["partition"]
    assert fedhet("train", spec, "federation.rounds=1", store=store).rc == 0
    cascaded = fedhet("artifacts", "rm", infos["partition"].key[:10], "--cascade", store=store)
    assert cascaded.rc == 0, cascaded.stderr
    assert ArtifactStore(store).ls() == []


def test_gc_dry_run_lists_without_removing(fedhet: CliRunner, tmp_path: Path):
    store = tmp_path / "store"
    stale = store / "train" / "0123abcd.zarr.tmp-1-dead"
    stale.mkdir(parents=True)
    dry = fedhet("artifacts", "gc", "--dry-run", store=store)
    assert dry.rc == 0 and f"would remove {stale}" in dry.stdout
    assert "1 entry would be removed" in dry.stdout and stale.exists()
    assert "1 entry removed" in fedhet("artifacts", "gc", store=store).stdout
    assert not stale.exists()


# --- 6. readable output ---------------------------------------------------------------------


def table_commands(spec: Path) -> list[list[str]]:
    return [
        ["train", str(spec), "matrix.seed=[0,1]"], ["partition", str(spec)], ["runs", str(spec)],
        ["plan", str(spec)], ["artifacts", "ls"],
    ]  # fmt: skip


def test_tables_fit_80_columns_without_cutting_values(fedhet: CliRunner, trained):
    spec, store = trained
    env = cli_env(store, COLUMNS="80")
    for command in table_commands(spec):
        result = fedhet(*command, env=env)
        assert result.rc == 0, (command, result.stderr)
        lines = result.stdout.splitlines()
        assert lines and max(map(len, lines)) <= 80, (command, result.stdout)
        assert "…" not in result.stdout, (command, result.stdout)
    runs = fedhet("runs", spec, env=env).stdout
    best = as_json(fedhet("runs", spec, "--format", "json", store=store))[0]["best_test_pct"]
    assert f"{best:.2f}" in runs  # accuracies in %, as in the JSON


def test_every_table_command_speaks_every_format(fedhet: CliRunner, trained):
    spec, store = trained
    for command in table_commands(spec):
        records = as_json(fedhet(*command, "--format", "json", store=store))
        assert records and all(isinstance(r, dict) for r in records)
        parsed = list(
            csv.DictReader(io.StringIO(fedhet(*command, "--format", "csv", store=store).stdout))
        )
        assert [list(r) for r in parsed[:1]] == [list(records[0])] and len(parsed) == len(records)
        markdown = fedhet(*command, "--format", "markdown", store=store).stdout
        table = [line for line in markdown.splitlines() if line.startswith("|")]
        assert re.fullmatch(r"\|(-{3}:?\|)+", table[1]), markdown
        cells = {len(re.split(r"(?<!\\)\|", line)) for line in table}  # escaped pipes are text
        assert len(cells) == 1 and len(table) > 2, markdown
    bad = fedhet("runs", spec, "--format", "xml", store=store)
    assert bad.rc == 2 and bad.stderr.count("\n") == 1


def test_spec_show_leaves_out_fields_that_do_not_apply(fedhet: CliRunner, tmp_path: Path):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({**SPEC, "model": {"arch": "mlp"}}))
    model = yaml.safe_load(fedhet("spec", "show", spec).stdout.split("# model")[0])["model"]
    assert set(model) == {"arch", "norm", "hidden"}
    result = fedhet("spec", "show", spec, "model={arch: resnet20, norm: group}")
    model = yaml.safe_load(result.stdout.split("# model")[0])["model"]
    assert set(model) == {"arch", "norm", "width", "groups"}


def test_schema_definitions_have_readable_names():
    names = set(json_schema()["$defs"])
    assert {"FedAvgConfig", "FedProxConfig", "ScaffoldConfig", "CentralizedConfig"} <= names
    assert not [n for n in names if "__" in n or n == "Config"]


# --- 8. help ------------------------------------------------------------------------------


COMMANDS = [
    ["spec", "validate"], ["spec", "show"], ["spec", "hash"], ["spec", "schema"], ["partition"],
    ["train"], ["plan"], ["runs"], ["artifacts", "ls"], ["artifacts", "rm"], ["artifacts", "gc"],
    ["artifacts", "verify"], ["virtual"],
]  # fmt: skip


def test_every_command_help_gives_an_example(fedhet: CliRunner):
    for command in COMMANDS:
        result = fedhet(*command, "--help")
        assert result.rc == 0, result.stderr
        assert re.search(rf"\$ fedhet {' '.join(command)}\b", result.stdout), command
