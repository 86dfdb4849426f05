"""One unit per quantity wherever fedhet shows it (fedhet.core.units). One trained matrix (two
algorithms x two seeds, two rounds) and each accuracy the same number in percent, each difference
of accuracies the same in points, in: the command line's tables (train, runs, as a terminal and
markdown table and as JSON), the progress lines, `fedhet export`, the report's markdown and
figure (a % axis), and the Python API's runs(), metrics() and compare(); a floor in points from
both. The store keeps its fractions."""

from __future__ import annotations

import csv
import io
import json
import re

import numpy as np
import pandas as pd
import pytest
from conftest import markdown_tables, write_spec

from fedhet import load
from fedhet.cli import columns as tables
from fedhet.cli.output import Column
from fedhet.core import units
from fedhet.core.errors import InputError
from fedhet.core.store import ArtifactStore
from fedhet.figures import curves_figure
from fedhet.reports import report

SPEC = {
    "name": "units",
    "data": {"dataset": "digits"},
    "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.5},
    "model": {"arch": "mlp", "hidden": [16]},
    "federation": {"rounds": 2, "batch_size": 32, "lr": 0.05},
    "runtime": {"threads": 1},  # progress on: lines, not being a terminal
    "matrix": {"algorithm": [{"name": "fedavg"}, {"name": "centralized"}], "seed": [0, 1]},
}
BEST = "Best test accuracy (the papers' metric)"


@pytest.fixture(scope="module")
def trained(fedhet, tmp_path_factory):
    """(spec, store, the train command's result as a markdown table)."""
    folder = tmp_path_factory.mktemp("units")
    spec, store = write_spec(folder / "units.yaml", SPEC), folder / "store"
    train = fedhet("train", spec, "--format", "markdown", "--store", store)
    assert train.rc == 0, train.stderr
    return spec, store, train


@pytest.fixture(scope="module")
def api(trained) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The API's runs() and metrics(), indexed by run label."""
    spec, store, _ = trained
    experiment = load(spec, store=store)
    return experiment.runs().set_index("label"), experiment.metrics()


def by_label(rows: list[dict], column: str) -> dict[str, str]:
    return {f"{r['algorithm']}, {r['setting']}, seed {r['seed']}": r[column] for r in rows}


def test_the_api_shows_accuracies_in_percent_of_the_stored_fractions(trained, api):
    _, store, _ = trained
    runs, metrics = api
    assert {"best_test_pct", "final_pct"} <= set(runs.columns) and "best_test" not in runs
    assert "test_accuracy_pct" in metrics and "test_accuracy" not in metrics
    assert "wall_time_s" in metrics and "wall_time" not in metrics  # each name says its unit
    stored = ArtifactStore(store)
    for label, run in runs.iterrows():
        curve = metrics[metrics.run == label].set_index("round").test_accuracy_pct
        fractions = stored.open("train", run.key)["metrics"]["test_accuracy"][:]
        assert list(curve) == pytest.approx(
            [100 * f for f in fractions], abs=1e-9
        )  # stored: fractions
        assert run.best_test_pct == curve.max() and run.final_pct == curve[2]
        seconds = metrics[metrics.run == label].wall_time_s
        assert run.wall_time_s == pytest.approx(seconds.sum(), rel=1e-12)  # both in seconds
        assert 10 < run.best_test_pct <= 100  # above chance, in percent


def test_the_command_lines_tables_export_and_progress_agree_with_the_api(fedhet, trained, api):
    spec, store, train = trained
    runs, metrics = api
    listed = json.loads(fedhet("runs", spec, "--format", "json", store=store).stdout)
    assert by_label(listed, "best_test_pct") == runs.best_test_pct.to_dict()  # the same floats
    exported = fedhet("export", spec, "--format", "csv", store=store).stdout
    rows = list(csv.DictReader(io.StringIO(exported)))
    assert [float(r["test_accuracy_pct"]) for r in rows] == list(metrics.test_accuracy_pct)
    assert [float(r["wall_time_s"]) for r in rows] == list(metrics.wall_time_s)
    shown = {f"{best:.2f}" for best in runs.best_test_pct}
    for text in (train.stdout, fedhet("runs", spec, "--format", "markdown", store=store).stdout):
        (table,) = markdown_tables(text.splitlines())
        column = table[0].index("best test %")
        assert {row[column] for row in table[2:]} == shown
    terminal = fedhet("runs", spec, store=store).stdout
    assert all(cell in terminal for cell in shown) and "best test %" in terminal
    for label, run in runs.iterrows():  # the last round's line: the final accuracy
        line = f"{label}: round 2/2 acc {run.final_pct:.2f}% loss "
        assert line in train.stderr, train.stderr


def test_the_report_and_compare_agree_in_points(fedhet, trained, api, tmp_path):
    spec, store, _ = trained
    runs, _ = api
    experiment = load(spec, store=store)
    paired = experiment.compare()
    best = paired[paired.metric == BEST].iloc[0]
    seeds = runs.set_index(["algorithm", "seed"]).best_test_pct
    differences = [seeds["Centralized", s] - seeds["FedAvg", s] for s in (0, 1)]
    assert best.unit == units.POINTS and best.differences == pytest.approx(differences)
    assert best.mean_difference == pytest.approx(np.mean(differences)) and best.mean_difference > 10
    assert fedhet("report", spec, "--out", tmp_path, store=store).rc == 0
    text = (tmp_path / "units.md").read_text()
    accuracy = markdown_tables(text.splitlines())[0]
    for algorithm in ("FedAvg", "Centralized"):
        (cell,) = [row[1] for row in accuracy if row[0] == algorithm]
        mean = float(cell.split(" ± ")[0])
        assert mean == pytest.approx(np.mean([seeds[algorithm, s] for s in (0, 1)]), abs=0.005)
    section = text.split(f"### {BEST}")[1]
    table = markdown_tables(section.splitlines())[0]
    assert table[0][3] == "mean difference (points)"
    assert table[2][3] == f"{best.mean_difference:+.2f}"
    per_run = markdown_tables(text.split("## Per run")[1].splitlines())[0]
    assert per_run[0][3] == "best test %"
    assert {row[3] for row in per_run[2:]} == {f"{b:.2f}" for b in runs.best_test_pct}


def test_the_report_figure_draws_the_same_accuracies_on_a_percent_axis(
    trained, api, tmp_path, monkeypatch
):
    spec, store, _ = trained
    _, metrics = api
    drawn = {}

    def draw(panels, path, title, boundaries, formats, percent, captions):
        drawn["figure"] = curves_figure(panels, title, boundaries, percent, captions)
        return []

    monkeypatch.setattr(report, "metric_curves", draw)  # the figure the report would save
    load(spec, store=store).report(tmp_path)
    accuracy = drawn["figure"].axes[0]  # test accuracy, the one setting
    assert accuracy.yaxis.get_major_formatter()(0.5, 0) == "50%"
    means = metrics.groupby(["algorithm", "round"]).test_accuracy_pct.mean()
    lines = {line.get_label(): line for line in accuracy.lines}
    for algorithm in ("FedAvg", "Centralized"):
        rounds, fractions = lines[algorithm].get_data()
        assert list(rounds) == [1, 2]
        assert 100 * np.asarray(fractions) == pytest.approx(means[algorithm].to_numpy())


def test_a_floor_in_points_gives_the_same_verdict_from_python_and_the_command_line(
    fedhet, trained, tmp_path
):
    spec, store, _ = trained
    experiment = load(spec, store=store)
    ahead = experiment.compare().query("verdict == 'ahead' and unit == 'points'")
    assert len(ahead), "a difference whose interval excludes 0, for the floor to decide"
    row = ahead.iloc[0]
    floors = [(row.mean_difference - 1, "ahead"), (row.mean_difference + 1, "negligible")]
    for floor, verdict in floors:
        paired = experiment.compare(floor=floor)
        assert paired[paired.metric == row.metric].verdict.item() == verdict
        out = tmp_path / verdict
        assert fedhet("report", spec, "--floor", floor, "--out", out, store=store).rc == 0
        text = (out / "units.md").read_text()
        table = markdown_tables(text.split(f"### {row.metric}\n")[1].splitlines())[0]
        # where either curve of the pair still moves the report marks the verdict, and
        # compare() says so in its early_training column
        mark = " (early training)" if row.early_training else ""
        assert table[2][6] == verdict + mark
        assert f"at least {floor:.2f} points" in text


def test_a_negative_floor_is_refused_from_python_as_from_the_command_line(
    fedhet, trained, tmp_path
):
    spec, store, _ = trained
    for floor in (-1, float("nan")):
        with pytest.raises(InputError, match=r"the floor is a difference in points, at least 0"):
            load(spec, store=store).compare(floor=floor)
    refused = fedhet("report", spec, "--floor", "-1", store=store)
    assert refused.rc == 2 and "Traceback" not in refused.stderr
    nothing = load(spec, store=tmp_path / "empty")  # refused before it trains anything
    with pytest.raises(InputError, match="at least 0"):
        nothing.report(tmp_path / "out", train=True, floor=-1)
    assert not (tmp_path / "empty" / "train").exists()


def test_a_percent_carries_no_binary_noise_into_what_a_person_pastes():
    assert 100 * 0.7493 != 74.93 and units.percent(0.7493) == 74.93
    assert json.dumps(units.shown_row({"best_test": 0.7493})) == '{"best_test_pct": 74.93}'
    assert units.fraction(units.percent(0.123456789)) == pytest.approx(0.123456789, abs=1e-12)


def test_every_percent_column_of_the_command_line_is_a_stored_fraction():
    """A `pct` column is converted by its name: each one's is known to fedhet.core.units."""
    columns = [
        c for value in vars(tables).values() if isinstance(value, list)
        for c in value if isinstance(c, Column) and c.kind == "pct"
    ]  # fmt: skip
    assert len(columns) > 10
    assert {c.key for c in columns} <= units.FRACTIONS
    assert all(re.search(r"%", c.header) for c in columns)


def test_a_header_names_the_unit_of_its_column(fedhet, tmp_path):
    """Degrees and rounds too, in the tables a person reads; JSON keeps the keys."""
    spec = write_spec(
        tmp_path / "rotated.yaml",
        {
            **SPEC,
            "partition": {**SPEC["partition"], "rotation": {"step": 30}},
            "eval": {"target_accuracy": 0.2},
            "matrix": {"seed": [0]},
        },
    )
    store = tmp_path / "store"
    trained = fedhet("train", spec, "--format", "markdown", store=store)
    assert trained.rc == 0, trained.stderr
    (table,) = markdown_tables(trained.stdout.splitlines())
    assert {"rounds to target", "time s", "best test %"} <= set(table[0])
    shown = fedhet("partition", spec, "--format", "markdown", store=store)
    table = markdown_tables(shown.stdout.splitlines())[0]
    assert [row[table[0].index("angle °")] for row in table[2:]] == ["0", "30", "60", "90"]
    rows = json.loads(fedhet("partition", spec, "--format", "json", store=store).stdout)
    assert [row["angle"] for row in rows] == [0, 30, 60, 90]
