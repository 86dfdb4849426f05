"""Reports never mix runs: a cell is one configuration (its runs differ only in the seed), its
label names every matrix axis that varies, its mean ± std is over exactly its seeds, and
`eval` / `report` never train unless asked to."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from conftest import CliRunner, markdown_tables, write_spec
from matplotlib.image import imread
from rich.console import Console

from fedhet.core.sealed import seal
from fedhet.core.spec import Spec, parse_spec
from fedhet.core.store import ArtifactStore
from fedhet.engine.run_format import write_metrics
from fedhet.execution.planning import Run, runs_of
from fedhet.reports.report import markdown_table, write_report

BASE: dict[str, Any] = {
    "name": "grouping",
    "seed": 0,
    "data": {"dataset": "digits"},
    "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.3},
    "model": {"arch": "mlp", "hidden": []},
    "federation": {"rounds": 2, "batch_size": 64, "lr": 0.1},
    "algorithm": {"name": "fedprox", "mu": 0.01},
    "runtime": {"threads": 1, "progress": False, "device": "cpu"},
}
LR_BY_MU = {"federation.lr": [0.1, 0.05], "algorithm.mu": [0.01, 0.1], "seed": [0, 1, 2]}
CLIENTS = {
    "partition": [
        {"scheme": "dirichlet", "alpha": 0.3, "clients": 4},
        {"scheme": "dirichlet", "alpha": 0.3, "clients": 6},
    ],
    "seed": [0, 1],
}


def matrix_spec(matrix: dict[str, Any], **changes: Any) -> Spec:
    return parse_spec({**BASE, **changes, "matrix": matrix})


def labels(runs: list[Run]) -> dict[str, tuple[str, str]]:
    return {run.group: (run.algorithm_label, run.setting_label) for run in runs}


# --- groups and labels ----------------------------------------------------------------------


def test_lr_by_mu_matrix_has_one_group_per_configuration_with_unique_labels():
    runs = runs_of(matrix_spec(LR_BY_MU))
    for run in runs:  # the group is the configuration, whatever the seed
        same_config = [
            other
            for other in runs
            if (other.spec.federation.lr, other.spec.algorithm.mu)
            == (run.spec.federation.lr, run.spec.algorithm.mu)
        ]
        assert {other.group for other in same_config} == {run.group}
        assert {other.spec.seed for other in same_config} == {0, 1, 2}
        lr, mu = run.spec.federation.lr, run.spec.algorithm.mu
        assert (run.algorithm_label, run.setting_label) == (f"FedProx (mu={mu})", f"lr={lr}")
    assert len(labels(runs)) == 4 and len(set(labels(runs).values())) == 4


def test_partitions_differing_only_in_clients_are_told_apart():
    runs = runs_of(matrix_spec(CLIENTS))
    assert sorted(set(labels(runs).values())) == [
        ("FedProx", "alpha=0.3, clients=4"),
        ("FedProx", "alpha=0.3, clients=6"),
    ]
    for run in runs:
        assert run.setting_label.endswith(f"clients={run.spec.partition.clients}")


def test_a_dotted_partition_axis_is_labelled_by_its_field():
    runs = runs_of(matrix_spec({"partition.clients": [4, 6]}))
    assert [run.setting_label for run in runs] == ["clients=4", "clients=6"]
    assert runs[0].group != runs[1].group


def test_a_setting_that_never_enters_a_key_does_not_split_or_name_a_group():
    runs = runs_of(matrix_spec({"runtime.threads": [1, 2], "seed": [0, 1]}))
    assert len({run.group for run in runs}) == 1
    assert {run.setting_label for run in runs} == {"alpha=0.3"}


def test_tct_runs_group_over_seeds_though_their_partitions_are_keyed_by_seed():
    tct = {
        "name": "tct",
        "stage1": {"rounds": 1},
        "entk": {"subsample": 50, "dtype": "fp32", "chunk": 100},
        "stage2": {"rounds": 1, "local_steps": 2, "lr": 1e-3},
    }
    runs = runs_of(
        matrix_spec(
            {"algorithm.stage2.lr": [1e-3, 1e-2], "seed": [0, 1]},
            algorithm=tct,
            model={"arch": "mlp", "hidden": [8]},
        )
    )
    assert [run.node.stage for run in runs] == ["regress"] * 4
    partitions = {run.node.walk()[0].key for run in runs}
    assert len(partitions) == 2  # one per seed, shared by both stage-2 settings
    by_lr = {lr: {r.group for r in runs if r.spec.algorithm.stage2.lr == lr} for lr in (1e-3, 1e-2)}
    assert all(len(groups) == 1 for groups in by_lr.values())
    assert by_lr[1e-3] != by_lr[1e-2]
    assert {run.algorithm_label for run in runs} == {
        "TCT (stage2.lr=0.001)",
        "TCT (stage2.lr=0.01)",
    }


# --- the report on synthetic stored results -------------------------------------------------


def accuracy_of(run: Run) -> float:
    """A distinct best accuracy per run: a function of the configuration and the seed."""
    return 0.3 + run.spec.federation.lr + 2 * (run.spec.algorithm.mu or 0) + 0.01 * run.spec.seed


def store_results(store: ArtifactStore, runs: list[Run], best: dict[str, float]) -> None:
    """A train artifact per run holding synthetic metrics: test accuracy rises to `best`."""
    for run in runs:
        rounds = run.spec.federation.rounds
        metrics = {
            "test_accuracy": np.linspace(best[run.node.key] / 2, best[run.node.key], rounds),
            "divergence": np.full(rounds, 0.1),
            "bytes_up": np.full(rounds, 1e6),
            "bytes_down": np.full(rounds, 2e6),
            "comm_rounds": np.ones(rounds),
            "wall_time": np.full(rounds, 0.5),
            "train_loss": np.ones(rounds),
            "test_loss": np.ones(rounds),
        }
        with store.lock("train", run.node.key), store.write("train", run.node.key, {}) as out:
            write_metrics(out, metrics)


def report_tables(spec: Spec, tmp_path: Path, best: dict[str, float]) -> list[list[list[str]]]:
    runs = runs_of(spec)
    store = ArtifactStore(tmp_path / "store")
    store_results(store, runs, best)
    md, _ = write_report(spec, runs, store, tmp_path / "out", Console(file=open("/dev/null", "w")))
    return markdown_tables(md.read_text().splitlines())


def mean_std_cell(values: list[float]) -> str:
    """By hand: the population standard deviation (ddof=0), the convention np.std uses."""
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return f"{100 * mean:.2f} ± {100 * std:.2f} (n={len(values)})"


def test_lr_by_mu_report_averages_each_configuration_over_its_own_seeds(tmp_path):
    spec = matrix_spec(LR_BY_MU)
    runs = runs_of(spec)
    best = {run.node.key: accuracy_of(run) for run in runs}
    accuracy, *_, cost, _stages, per_run = report_tables(spec, tmp_path, best)
    assert accuracy[0] == ["algorithm", "lr=0.1", "lr=0.05"]
    assert [row[0] for row in accuracy[2:]] == ["FedProx (mu=0.01)", "FedProx (mu=0.1)"]
    for row in accuracy[2:]:
        mu = float(row[0].split("mu=")[1].rstrip(")"))
        for lr, cell in zip((0.1, 0.05), row[1:], strict=True):
            seeds = [0.3 + lr + 2 * mu + 0.01 * seed for seed in (0, 1, 2)]
            assert cell == mean_std_cell(seeds)
    # e.g. lr=0.1, mu=0.01: 42.00, 43.00, 44.00 -> 43.00 ± 0.82 (ddof=1 would give 1.00)
    assert accuracy[2][1] == "43.00 ± 0.82 (n=3)"
    assert [row[2] for row in cost[2:]] == ["3"] * 4  # the seeds column
    assert len(per_run) == 2 + 12 and len({row[-1] for row in per_run[2:]}) == 12


def stored_seconds(store: ArtifactStore, stage: str, key: str, seconds: float) -> None:
    """Store an empty `stage` artifact if there is none; make its compute time `seconds`."""
    if not store.exists(stage, key):
        with store.lock(stage, key), store.write(stage, key, {}):
            pass
    group = zarr.open_group(store.path(stage, key), mode="r+")
    group.attrs["wall_time_s"] = seconds
    seal(group)  # as if it had taken that long


def test_stage_table_gives_each_stage_its_mean_stored_seconds_over_seeds(tmp_path):
    spec = matrix_spec(LR_BY_MU)
    runs = runs_of(spec)
    store = ArtifactStore(tmp_path / "store")
    store_results(store, runs, {run.node.key: accuracy_of(run) for run in runs})
    for run in runs:
        partition, train = run.node.walk()
        stored_seconds(store, "partition", partition.key, 1.0 + run.spec.seed)
        stored_seconds(
            store, "train", train.key, 10.0 * run.spec.seed + 100 * run.spec.federation.lr
        )
    md, _ = write_report(spec, runs, store, tmp_path / "out", Console(file=open("/dev/null", "w")))
    stages = markdown_tables(md.read_text().splitlines())[-2]
    assert stages[0] == ["algorithm", "setting", "seeds", "partition s", "train s", "total s"]
    by_cell = {(row[0], row[1]): row[2:] for row in stages[2:]}
    # partition: seeds 0, 1, 2 -> 1, 2, 3 s; train: 10 * seed + 100 * lr
    assert by_cell["FedProx (mu=0.01)", "lr=0.1"] == ["3", "2.0", "20.0", "22.0"]
    assert by_cell["FedProx (mu=0.1)", "lr=0.05"] == ["3", "2.0", "15.0", "17.0"]


def test_partitions_differing_in_clients_get_their_own_columns_and_numbers(tmp_path):
    spec = matrix_spec(CLIENTS)
    runs = runs_of(spec)
    best = {
        run.node.key: 0.2 + run.spec.partition.clients / 10 + run.spec.seed / 100 for run in runs
    }
    accuracy = report_tables(spec, tmp_path, best)[0]
    assert accuracy[0] == ["algorithm", "alpha=0.3, clients=4", "alpha=0.3, clients=6"]
    assert accuracy[2][1:] == [mean_std_cell([0.6, 0.61]), mean_std_cell([0.8, 0.81])]
    assert accuracy[2][1:] == ["60.50 ± 0.50 (n=2)", "80.50 ± 0.50 (n=2)"]


def test_a_cell_with_one_seed_shows_no_spread(tmp_path):
    spec = matrix_spec({"federation.lr": [0.1, 0.05]})
    runs = runs_of(spec)
    accuracy, rounds_to_reference, *_ = report_tables(
        spec, tmp_path, {run.node.key: accuracy_of(run) for run in runs}
    )
    assert accuracy[2] == ["FedProx", "42.00 (n=1)", "37.00 (n=1)"]
    assert "±" not in "".join(accuracy[2])
    # the reference (the only row) reaches its own best in the last round
    assert rounds_to_reference[2] == ["FedProx", "2.0 (1/1)", "2.0 (1/1)"]


def test_two_groups_under_one_label_never_share_a_cell():
    rows = [
        {"algorithm": "fedavg", "setting": "iid", "group": group, "best_test": 0.5}
        for group in ("a", "b")
    ]
    with pytest.raises(ValueError, match="must not mix"):
        markdown_table(rows)


# --- eval and report never train ------------------------------------------------------------


def two_seed_spec(folder: Path) -> Path:
    return write_spec(folder / "seeds.yaml", {**BASE, "name": "seeds", "matrix": {"seed": [0, 1]}})


def test_eval_and_report_name_the_missing_runs_and_exit_2(fedhet: CliRunner, tmp_path):
    spec = two_seed_spec(tmp_path)
    keys = [run.node.key[:12] for run in runs_of(parse_spec({**BASE, "matrix": {"seed": [0, 1]}}))]
    for command in (["eval", spec], ["report", spec, "--out", tmp_path / "out"]):
        result = fedhet(*command, store=tmp_path / "store")
        assert result.rc == 2, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(
            "error: 2 of 2 runs are not stored (FedProx, alpha=0.3, seed 0 (train "
        )
        assert all(key in line for key in keys)
        assert line.endswith(f"run `fedhet train {spec}` first or pass --train")
    assert not (tmp_path / "store" / "train").exists() and not (tmp_path / "out").exists()


def test_report_with_train_trains_then_reads_what_it_stored(fedhet: CliRunner, tmp_path):
    spec, store, out = two_seed_spec(tmp_path), tmp_path / "store", tmp_path / "out"
    trained = fedhet("report", spec, "--out", out, "--train", store=store)
    assert trained.rc == 0, trained.stderr
    assert trained.stderr.count("computing") >= 2
    again = fedhet("report", spec, "--out", out, store=store)  # now nothing is missing
    assert again.rc == 0 and "computing" not in again.stderr and "reusing" not in again.stderr
    accuracy = markdown_tables((out / "seeds.md").read_text().splitlines())[0]
    stored = ArtifactStore(store)
    bests = [
        float(np.nanmax(stored.open("train", run.node.key)["metrics"]["test_accuracy"][:]))
        for run in runs_of(parse_spec({**BASE, "matrix": {"seed": [0, 1]}}))
    ]
    assert accuracy[2] == ["FedProx", mean_std_cell(bests)]
    curves = imread(out / "seeds.png")[..., :3]
    blue = np.all(np.abs(curves - np.array([0x1F, 0x77, 0xB4]) / 255) < 0.05, axis=-1)
    assert blue.sum() > 200  # the curves are drawn (matplotlib's first line colour)
    evaluated = fedhet("eval", spec, "--json", store=store)
    assert evaluated.rc == 0 and "computing" not in evaluated.stderr


def test_a_cell_whose_every_run_diverged_has_no_total():
    """tct_fmnist's SCAFFOLD at #C=2: its partitions took 0.0 s and no run finished training,
    which the table totalled as 0.0 s."""
    from fedhet.reports.tables import stage_table

    def row(algorithm: str, seconds: dict, diverged: int | None) -> dict:
        return {"algorithm": algorithm, "setting": "#C=2", "group": algorithm,
                "stage_seconds": seconds, "diverged": diverged}  # fmt: skip

    rows = [row("SCAFFOLD", {"partition": 0.01}, 9), row("SCAFFOLD", {"partition": 0.01}, 12)]
    rows += [row("FedAvg", {"partition": 0.01, "train": 18.0}, None), row("FedAvg", {}, 3)]
    table = {r[0]: r[2:] for r in markdown_tables(stage_table(rows).splitlines())[0][2:]}
    assert table["SCAFFOLD"] == ["2", "0.0", "-", "-"]
    assert table["FedAvg"] == ["2", "0.0", "18.0", "18.0"]  # one run finished: its stages
