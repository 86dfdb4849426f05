"""The personalized accuracy of `fedhet eval`, `fedhet report` and the Python API (issue 48),
from one tiny 2-round matrix (FedAvg, Ditto, FedPer; 2 seeds; 5 clients, one a round, so that
some clients are never sampled):

- the report's personalized tables and paired intervals equal the figures computed by hand from
  `fedhet eval`'s per-client accuracies and the partition's client sizes;
- a client never sampled is counted (scored with the model it holds before training), not
  skipped;
- the global model's accuracy is the final global model on the test set, none for FedPer;
- the API's `personalized()` and `compare()` give the same numbers, in percent.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import markdown_tables, write_spec
from rich.console import Console
from scipy import stats

from fedhet.api import load
from fedhet.core.errors import InputError
from fedhet.core.pipeline import RunContext
from fedhet.core.spec import load_spec
from fedhet.core.store import ArtifactStore
from fedhet.data.partition_format import load_partition
from fedhet.engine import tensors
from fedhet.engine.loop import Engine, evaluate
from fedhet.engine.run_format import read_client_states
from fedhet.engine.setup import build_setup
from fedhet.execution.planning import runs_of
from fedhet.reports.evaluation import client_tests

CLIENTS = 5
SPEC = {
    "name": "pfl-report",
    "seed": 0,
    "data": {"dataset": "digits"},
    "partition": {"scheme": "classes", "clients": CLIENTS, "classes_per_client": 2},
    "model": {"arch": "mlp", "hidden": [16]},
    "federation": {
        "rounds": 2, "clients_per_round": 1, "batch_size": 16, "lr": 0.1, "local_steps": 3,
    },
    "eval": {"client_test": {"per_client": 30}},
    "runtime": {"threads": 1, "progress": False, "device": "cpu"},
    "matrix": {
        "algorithm": [{"name": "fedavg"}, {"name": "ditto"}, {"name": "fedper"}],
        "seed": [0, 1],
    },
}  # fmt: skip
SCORED = {  # the report's columns, and how each is computed from the clients' accuracies
    "weighted mean (%)": lambda acc, sizes: np.average(acc, weights=sizes),
    "mean (%)": lambda acc, sizes: np.mean(acc),
    "worst 10% (%)": lambda acc, sizes: np.sort(acc)[: math.ceil(len(acc) / 10)].mean(),
    "std over clients (%)": lambda acc, sizes: np.std(acc),
}


@pytest.fixture(scope="module")
def trained(fedhet, tmp_path_factory) -> tuple[Path, Path, list[dict]]:
    """(spec, store, `fedhet eval --json`'s reports) of the trained matrix."""
    folder = tmp_path_factory.mktemp("personalized")
    spec, store = write_spec(folder / "spec.yaml", SPEC), folder / "store"
    result = fedhet("train", spec, "--store", store)
    assert result.rc == 0, result.stderr
    evaluated = fedhet("eval", spec, "--json", "--store", store)
    assert evaluated.rc == 0, evaluated.stderr
    return spec, store, json.loads(evaluated.stdout)


def client_sizes(store: Path, run) -> np.ndarray:
    partition = ArtifactStore(store).open("partition", run.node.upstream["partition"].key)
    return load_partition(partition).histogram.sum(axis=1)


def percent_cell(values: list[float]) -> str:
    """A report cell by hand: mean ± std over the seeds, in %."""
    return f"{np.mean(values):.2f} ± {np.std(values):.2f} (n={len(values)})"


def section_of(text: str) -> str:
    return text.split("\n## Personalized accuracy\n")[1].split("\n## ")[0]


def test_report_figures_equal_those_computed_by_hand(fedhet, trained, tmp_path):
    spec_path, store, reports = trained
    result = fedhet("report", spec_path, "--store", store, "--out", tmp_path)
    assert result.rc == 0, result.stderr
    section = section_of((tmp_path / "pfl-report.md").read_text())
    table, *paired = markdown_tables(section.splitlines())
    assert table[0] == ["algorithm", *SCORED, "global model (%)"]
    runs = runs_of(load_spec(spec_path))
    by_algorithm: dict[str, list[tuple[dict, np.ndarray]]] = {}  # by algorithm.name
    label = {}  # algorithm.name -> its row label
    for run, report in zip(runs, reports, strict=True):
        name = run.spec.algorithm.name
        by_algorithm.setdefault(name, []).append((report, client_sizes(store, run)))
        label[name] = report["algorithm"]
    rows = {row[0]: row[1:] for row in table[2:]}
    for algorithm, measured in by_algorithm.items():
        row = rows[label[algorithm]]
        for column, (title, by_hand) in enumerate(SCORED.items()):
            values = [by_hand(np.asarray(r["client_test_pct"]), sizes) for r, sizes in measured]
            assert row[column] == percent_cell(values), (algorithm, title)
        global_model = [r["global_accuracy_pct"] for r, _ in measured]
        if algorithm == "fedper":  # its clients alone hold its head: no global model
            assert global_model == [None, None] and row[-1] == "-"
        else:
            assert row[-1] == percent_cell(global_model), algorithm
    # the weighted mean's paired interval against FedAvg, by hand over the two seeds
    weighted = {a: [np.average(r["client_test_pct"], weights=s) for r, s in m] for a, m in
                by_algorithm.items()}  # fmt: skip
    differences = np.subtract(weighted["ditto"], weighted["fedavg"])
    half = stats.t.ppf(0.975, 1) * differences.std(ddof=1) / math.sqrt(2)
    ditto = next(row for row in paired[0] if row[0] == label["ditto"])
    assert ditto[2:5] == [
        "2",
        f"{differences.mean():+.2f}",
        f"[{differences.mean() - half:+.2f}, {differences.mean() + half:+.2f}]",
    ]
    # its verdict as compare() gives it, marked where FedAvg's curve has not levelled off
    compared = load(spec_path, store=store).compare()
    same = compared.metric.str.contains("weighted mean over clients")
    (api_row,) = compared[same & (compared.algorithm == label["ditto"])].itertuples()
    assert ditto[6] == api_row.verdict + (" (early training)" if api_row.early_training else "")
    fedper_global = next(
        r for r in paired[-1] if r[0] == label["fedper"]
    )  # the global model's table
    assert fedper_global[2] == "0" and "2 algorithm no global model" in fedper_global[-1]
    assert (tmp_path / "pfl-report-personalized.png").is_file()
    assert "![personalized accuracy](pfl-report-personalized.png)" in section


def test_a_client_never_sampled_is_counted_with_the_model_it_holds(trained):
    """Ditto, one client a round for two rounds: at least 3 of the 5 clients never train; each
    is scored on its own test set with the initial model, and the mean is over all 5."""
    spec_path, store, reports = trained
    st = ArtifactStore(store)
    ditto = [
        (run, report)
        for run, report in zip(runs_of(load_spec(spec_path)), reports, strict=True)
        if run.spec.algorithm.name == "ditto"
    ]
    for run, report in ditto:
        group = st.open("train", run.node.key)
        trained_clients = {c for c, state in read_client_states(group["model"]).items() if state}
        never = sorted(set(range(CLIENTS)) - trained_clients)
        assert len(never) >= 3 and len(report["client_test_pct"]) == CLIENTS
        assert not any(math.isnan(a) for a in report["client_test_pct"])
        assert report["client_test_mean_pct"] == pytest.approx(np.mean(report["client_test_pct"]))
        engine = Engine.from_spec(run.spec, Path(st.root) / "scratch")
        model = engine.algorithm.build_model()
        model.load_state_dict(engine.algorithm.initial_model)
        setup = build_setup(run.spec, st.open("partition", run.node.upstream["partition"].key))
        tests = client_tests(run, _context(run, st), torch.device("cpu"))
        for cid in never:
            expected = evaluate(model, tests[cid].x, tests[cid].y, setup.dataset.num_classes)[0]
            assert report["client_test_pct"][cid] == pytest.approx(100 * expected, abs=1e-10)
        final = tensors.load(group["model"], "final", "cpu")
        model.load_state_dict(final)
        on_test = evaluate(model, setup.dataset.test_x, setup.dataset.test_y, 10)[0]
        assert report["global_accuracy_pct"] == pytest.approx(100 * on_test, abs=1e-10)


def _context(run, store: ArtifactStore) -> RunContext:
    return RunContext(run.spec, store, Console(quiet=True))


def test_the_api_gives_the_reports_figures_in_percent(trained):
    spec_path, store, reports = trained
    experiment = load(spec_path, store=store)
    table = experiment.personalized()
    assert len(table) == len(reports)
    runs = runs_of(load_spec(spec_path))
    for (_, row), report, run in zip(table.iterrows(), reports, runs, strict=True):
        assert row["key"] == report["key"]
        for name in ("client_test_weighted_mean_pct", "client_test_worst_decile_pct"):
            assert row[name] == pytest.approx(report[name], abs=1e-10)
        if run.spec.algorithm.name == "fedper":
            assert row["global_accuracy_pct"] is None or math.isnan(row["global_accuracy_pct"])
        else:
            assert row["global_accuracy_pct"] == pytest.approx(report["global_accuracy_pct"])
    compared = experiment.compare()
    weighted = compared[compared["metric"].str.contains("weighted mean over clients")]
    others = {report["algorithm"] for report in reports[2:]}  # Ditto's and FedPer's labels
    assert set(weighted["algorithm"]) == others and set(weighted["pairs"]) == {2}
    assert (weighted["unit"] == "points").all()


def test_the_api_refuses_personalized_without_client_tests(tmp_path):
    spec = write_spec(tmp_path / "s.yaml", {k: v for k, v in SPEC.items() if k != "eval"})
    with pytest.raises(InputError, match="eval.client_test"):
        load(spec, store=tmp_path / "store").personalized()
