"""`fedhet tune` never stops at an edge silently: a choice that is the lowest or highest value
tried is flagged (in `tune`'s output, the stored outcome and the report's Tuning section); with
`tune.extend_edges` the grid gains the next value past it, in its own spacing, and is tuned
again, reusing every stored trial; with `tune.runoff` close trials run more seeds and the choice
is the best mean. Without either field, every key and choice is today's."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, CliRunner, write_spec

from fedhet.core.spec import load_spec, parse_spec
from fedhet.core.store import ArtifactStore
from fedhet.execution.planning import Run
from fedhet.reports.tuning import edge_notes
from fedhet.tuning.choice import choose
from fedhet.tuning.edges import edges_of, past
from fedhet.tuning.groups import tune_groups
from fedhet.tuning.outcome import STAGE, outcome_of, read_outcome, tune_key
from fedhet.tuning.selection import close_trials, runoff_winner

# FedAvg on digits, 2 rounds: the larger learning rate is clearly better (0.01 scores about 22%
# on validation, 0.003 about 17%, 0.001 about 15%), so the grid's choice is its highest value.
EDGE_SPEC: dict[str, Any] = {
    "name": "edge",
    "data": {"dataset": "digits", "validation": 0.2},
    "partition": {"scheme": "iid", "clients": 2},
    "model": {"arch": "mlp", "hidden": [16]},
    "federation": {"rounds": 2, "batch_size": 32, "lr": 0.05},
    "runtime": {"threads": 1, "progress": False},
    "matrix": {"algorithm": [{"name": "fedavg"}], "seed": [0]},
    "tune": {"trials": 3, "seeds": [7], "space": {"federation.lr": {"grid": [0.001, 0.003, 0.01]}}},
}


# --- the value past an edge, and what an edge is ---------------------------------------------


@pytest.mark.parametrize(
    ("grid", "below", "above"),
    [
        ([0.001, 0.003, 0.01], 0.0003, 0.03),  # a 1-3 series per decade goes on
        ([0.1, 0.01, 0.001], 0.0001, 1.0),  # tct_fmnist_table3's, listed downwards
        ([0.001, 0.00316227766, 0.01, 0.0316227766, 0.1], 0.000316227766, 0.316227766),
        ([0.02, 0.05, 0.1, 0.2], 0.01, 0.5),  # 1-2.5-5
        ([0.1, 0.2], 0.05, 0.4),  # two values: geometric
        ([1, 2, 4, 8], 0, 16),  # equal ratios, integers stay integers
        ([1, 2, 3], 0, 4),  # equal differences
        ([0.0, 0.5, 0.9], -0.5, 1.3),  # uneven, not all positive: the outer difference again
        ([0.1, 0.15, 0.5], 0.0666666666667, 1.66666666667),  # uneven: the outer ratio again
    ],
)
def test_the_value_past_an_edge_is_one_more_step_of_the_grid(grid, below, above):
    assert past(grid, "lowest") == below and past(grid, "highest") == above
    assert type(past(grid, "highest")) is type(grid[0])


def test_an_edge_is_the_lowest_or_highest_numeric_value_tried():
    tried = [{"lr": lr, "mu": mu} for lr in (0.1, 0.3) for mu in (0.01, 0.1)]
    kinds = {"lr": "grid", "mu": "grid"}
    edges = edges_of(kinds, tried, {"lr": 0.3, "mu": 0.01})
    assert [(e.path, e.value, e.side) for e in edges] == [
        ("lr", 0.3, "highest"),
        ("mu", 0.01, "lowest"),
    ]
    assert edges_of({"lr": "choice", "mu": "grid"}, tried, {"lr": 0.3, "mu": 0.1})[0].path == "mu"
    middle = [{"lr": 0.1}, {"lr": 0.2}, {"lr": 0.3}]
    assert edges_of({"lr": "log_uniform"}, middle, {"lr": 0.2}) == []
    assert edges_of({"lr": "grid"}, [{"lr": 0.1}], {"lr": 0.1}) == []  # one value: no search
    flags = [{"norm": "group"}, {"norm": "none"}, {"bias": True}, {"bias": False}]
    assert edges_of({"norm": "grid", "bias": "grid"}, flags, {"norm": "none", "bias": True}) == []


# --- the runoff rule on constructed scores -----------------------------------------------------


def test_close_trials_are_within_the_threshold_or_the_best_trials_seed_noise():
    scores = [0.700, 0.800, 0.795, 0.780, math.nan]
    # one selection seed: no noise to measure, the threshold alone
    assert close_trials(scores, [0.800], within=0.01, most=3) == [1, 2]
    assert close_trials(scores, [0.800], within=0.001, most=3) == []  # only the best: no runoff
    assert close_trials(scores, [0.800], within=0.5, most=2) == [1, 2]  # best and runner-up
    # two seeds whose spread (standard deviation 0.0283) exceeds the threshold: it decides
    assert close_trials(scores, [0.78, 0.82], within=0.001, most=5) == [1, 2, 3]
    assert close_trials([math.nan, math.nan], [], within=0.1, most=2) == []


def test_the_runoff_chooses_the_best_mean_over_every_seed():
    close = [1, 2]  # the best first
    assert runoff_winner(close, [0.79, 0.81]) == 2  # the runner-up's mean is higher
    assert runoff_winner(close, [0.80, 0.80]) == 1  # equal: the search's best
    assert runoff_winner(close, [math.nan, 0.75]) == 2  # a diverged runoff run loses
    assert runoff_winner(close, [math.nan, math.nan]) == 1


# --- the search, extended and run off, with constructed scores ----------------------------------


def _scored_by(score: Any) -> Any:
    """A measure that trains nothing: every run's validation curve is `score(its spec)`."""

    def measure(runs: list[Run]) -> dict[str, list[float]]:
        return {run.node.key: [score(run.spec)] for run in runs}

    return measure


def _choices(spec_data: dict[str, Any], score: Any) -> list[Any]:
    spec = parse_spec(spec_data)
    choices, complete = choose(tune_groups(spec, spec.tune), spec.tune, _scored_by(score))
    assert complete
    return choices


def _peaked_at_0_1(spec: Any) -> float:
    return 0.9 - abs(math.log10(spec.federation.lr / 0.1)) / 10


def test_extending_stops_once_the_choice_is_inside_or_at_the_limit():
    data = copy.deepcopy(EDGE_SPEC)
    data["tune"]["extend_edges"] = 3
    (choice,) = _choices(data, _peaked_at_0_1)
    tried = [trial.values["federation.lr"] for trial in choice.trials]
    assert tried == [0.001, 0.003, 0.01, 0.03, 0.1, 0.3]  # 0.3 brackets 0.1: no more
    assert choice.added == {"federation.lr": [0.03, 0.1, 0.3]} and choice.group.budget == 6
    assert choice.trials[choice.chosen].values == {"federation.lr": 0.1} and not choice.grid_edges()
    data["tune"]["extend_edges"] = 1
    (limited,) = _choices(data, _peaked_at_0_1)
    assert limited.trials[limited.chosen].values == {"federation.lr": 0.03}
    edge = limited.grid_edges()[0]
    assert limited.stops[edge.path, edge.side] == (
        "the grid was extended 1 times, tune.extend_edges's limit"
    )


def test_a_grid_extended_in_one_field_keeps_its_trials_and_adds_a_slice_after_them():
    data = copy.deepcopy(EDGE_SPEC)
    data["matrix"]["algorithm"] = [{"name": "fedprox"}]
    space = {"federation.lr": {"grid": [0.1, 0.3]}, "algorithm.mu": {"grid": [0.01, 0.1]}}
    data["tune"].update(trials=4, space=space, extend_edges=1)

    def score(spec: Any) -> float:  # higher lr better, mu inside (0.01 best of two is an edge)
        return spec.federation.lr + (spec.algorithm.mu == 0.01) * 0.01

    (choice,) = _choices(data, score)
    points = [(t.values["federation.lr"], t.values["algorithm.mu"]) for t in choice.trials]
    assert points[:4] == [(0.1, 0.01), (0.1, 0.1), (0.3, 0.01), (0.3, 0.1)]  # numbered as before
    # lr's next value (x3: two values are geometric) with every mu, then mu's (a decade) with
    # every lr: the grid stays the product of its fields' values
    assert points[4:] == [(0.9, 0.01), (0.9, 0.1), (0.1, 0.001), (0.3, 0.001), (0.9, 0.001)]
    assert choice.trials[choice.chosen].values == {"federation.lr": 0.9, "algorithm.mu": 0.01}
    assert [(e.path, e.side) for e in choice.grid_edges()] == [("federation.lr", "highest")]


def test_an_invalid_value_past_an_edge_stops_the_extension_and_says_why():
    data = copy.deepcopy(EDGE_SPEC)
    data["tune"].update(
        trials=2, extend_edges=2, space={"federation.momentum": {"grid": [0.5, 0.9]}}
    )
    (choice,) = _choices(data, lambda spec: spec.federation.momentum)
    assert len(choice.trials) == 2 and choice.added == {}
    stop = choice.stops["federation.momentum", "highest"]
    assert stop.startswith("the next value, 1.62, gives an invalid run (") and "momentum" in stop


def test_a_range_at_its_edge_is_flagged_and_left_to_widen():
    data = copy.deepcopy(EDGE_SPEC)
    space = {"federation.lr": {"log_uniform": [0.001, 0.01]}}
    data["tune"].update(trials=4, batch=2, sampler="tpe", space=space, extend_edges=2)
    choices = _choices(data, lambda spec: spec.federation.lr)
    outcome = outcome_of("k", parse_spec(data).tune, choices)
    tried = [t.values["federation.lr"] for t in outcome.selections[0].trials]
    assert len(tried) == 4 and outcome.selections[0].values["federation.lr"] == max(tried)
    (note,) = edge_notes(outcome)
    assert note.startswith("FedAvg (iid): lr=") and note.endswith(
        "is the highest value tried: the optimum may lie above; widen the range"
    )


def test_a_runoff_runs_the_close_trials_on_its_seeds_and_chooses_by_mean():
    data = copy.deepcopy(EDGE_SPEC)
    data["tune"].update(
        seeds=[7, 8],
        runoff={"seeds": [9], "within": 0.0},
        space={"federation.lr": {"grid": [0.001, 0.003, 0.01]}},
    )

    def score(spec: Any) -> float:  # 0.01 best on the selection seeds, 0.003 on seed 9, by far
        base = {0.001: 0.5, 0.003: 0.6, 0.01: 0.62}[spec.federation.lr]
        noise = {7: 0.03, 8: -0.03, 9: 0.0}[spec.seed]  # seed-to-seed std of 0.042 > 0.02
        return base + noise + (0.2 if spec.seed == 9 and spec.federation.lr == 0.003 else 0)

    (choice,) = _choices(data, score)
    ran = [t.values["federation.lr"] for t in choice.trials if t.runoff]
    assert ran == [0.003, 0.01] and all(len(t.runoff) == 1 for t in choice.trials if t.runoff)
    assert choice.trials[choice.chosen].values == {"federation.lr": 0.003}
    assert choice.trials[2].runoff[0].spec.seed == 9  # an ordinary run on the runoff's seed


def test_a_runoff_that_moves_the_choice_onto_an_edge_extends_that_grid():
    """Seed 7 prefers 0.003, the runoff's seed 9 the highest value, 0.01: the grid gains 0.03,
    which scores low, so 0.01 is chosen again and no longer lies at an edge (DANN in FedBR
    Table 1's tune was left at its edge with an extension unused)."""
    data = copy.deepcopy(EDGE_SPEC)
    data["tune"].update(extend_edges=2, runoff={"seeds": [9], "within": 0.05})

    def score(spec: Any) -> float:
        on_seed_7 = {0.001: 0.5, 0.003: 0.62, 0.01: 0.60, 0.03: 0.4}
        on_seed_9 = {0.003: 0.55, 0.01: 0.70}
        table = on_seed_7 if spec.seed == 7 else on_seed_9
        return table[round(spec.federation.lr, 6)]

    (choice,) = _choices(data, score)
    assert [t.values["federation.lr"] for t in choice.trials] == [0.001, 0.003, 0.01, 0.03]
    assert choice.added == {"federation.lr": [0.03]} and choice.extensions == 1
    assert choice.trials[choice.chosen].values == {"federation.lr": 0.01}
    assert not choice.grid_edges() and not choice.stops


def test_a_runoff_leaves_a_clear_choice_as_it_is_beside_a_close_one():
    """Two methods, one with two close trials and one with a clear best: only the first runs
    the runoff (a tune crashed with an IndexError on the second, TCT Table 3's)."""
    data = copy.deepcopy(EDGE_SPEC)
    data["matrix"]["algorithm"] = [{"name": "fedavg"}, {"name": "fedprox", "mu": 0.01}]
    data["tune"]["runoff"] = {"seeds": [9], "within": 0.05}

    def score(spec: Any) -> float:  # FedAvg: 0.003 and 0.01 within 0.05; FedProx: 0.01 by far
        if spec.algorithm.name == "fedavg":
            return {0.001: 0.5, 0.003: 0.6, 0.01: 0.62}[spec.federation.lr]
        return {0.001: 0.3, 0.003: 0.4, 0.01: 0.9}[spec.federation.lr]

    fedavg, fedprox = _choices(data, score)
    assert [t.values["federation.lr"] for t in fedavg.trials if t.runoff] == [0.003, 0.01]
    assert fedavg.trials[fedavg.chosen].values == {"federation.lr": 0.01}
    assert not any(t.runoff for t in fedprox.trials)
    assert fedprox.trials[fedprox.chosen].values == {"federation.lr": 0.01}


def test_a_tune_stored_before_edges_were_recorded_has_them_found_when_read(tmp_path: Path):
    data = copy.deepcopy(EDGE_SPEC)
    outcome = outcome_of("k" * 64, parse_spec(data).tune, _choices(data, _peaked_at_0_1))
    assert [(e.path, e.value, e.side, e.stop) for e in outcome.selections[0].edges] == [
        ("federation.lr", 0.01, "highest", None)
    ]
    old = dataclasses.asdict(outcome)
    del old["runoff_seeds"]
    for selection in old["selections"]:
        del selection["edges"], selection["extended"]
        for trial in selection["trials"]:
            del trial["runoff_keys"], trial["runoff_scores"]
    store = ArtifactStore(tmp_path)
    with store.write(STAGE, outcome.key, {"tune": json.loads(json.dumps(old))}):
        pass
    assert read_outcome(store, outcome.key, "edge.yaml") == outcome


# --- keys ---------------------------------------------------------------------------------------


def test_the_new_fields_at_their_defaults_keep_every_tune_key():
    spec = load_spec(REPO / "specs" / "tune_digits.yaml")
    groups = tune_groups(spec, spec.tune)
    # the key main computed before these fields existed (c7ff96b)
    assert tune_key(spec.tune, groups) == (
        "ed2d9462251040530fcc97395e0b0ae62b149e41ef10e062fbc519c2b74183ec"
    )
    same = spec.tune.model_copy(update={"extend_edges": 0, "runoff": None})
    assert tune_key(same, groups) == tune_key(spec.tune, groups)
    extended = spec.tune.model_validate({**spec.tune.model_dump(), "extend_edges": 1})
    assert tune_key(extended, groups) != tune_key(spec.tune, groups)


def test_runoff_seeds_must_be_new(fedhet: CliRunner, tmp_path: Path):
    data = copy.deepcopy(EDGE_SPEC)
    data["tune"]["runoff"] = {"seeds": [7, 9]}
    result = fedhet("spec", "validate", write_spec(tmp_path / "bad.yaml", data))
    assert result.rc == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "runoff.seeds: [7] already a selection seed; a runoff adds seeds" in result.stderr


# --- through the command line -------------------------------------------------------------------


def _train_keys(store: Path) -> set[str]:
    return {a.key for a in ArtifactStore(store).ls() if a.stage == "train"}


def _stored_outcome(store: Path, key_start: str = "") -> dict[str, Any]:
    (tune,) = [
        a for a in ArtifactStore(store).ls() if a.stage == STAGE and a.key.startswith(key_start)
    ]
    return tune.attrs["tune"]


def test_a_choice_at_the_grids_edge_is_flagged_then_extended_reusing_the_stored_trials(
    fedhet: CliRunner, tmp_path: Path
):
    spec, store = write_spec(tmp_path / "edge.yaml", copy.deepcopy(EDGE_SPEC)), tmp_path / "store"
    first = fedhet("tune", spec, "--trials", "--format", "json", store=store)
    assert first.rc == 0, first.stderr
    trials = json.loads(first.stdout)
    scores = {t["values"]: t["val_score_pct"] for t in trials}
    assert scores["lr=0.01"] > scores["lr=0.003"] > scores["lr=0.001"]  # as the spec intends
    flag = "FedAvg (iid): lr=0.01 is the highest value tried: the optimum may lie above; extend "
    (warning,) = [line for line in first.stderr.splitlines() if line.startswith("warning:")]
    assert warning.startswith(f"warning: {flag}the grid (tune.extend_edges")
    assert warning in (REPO / "docs" / "how-to" / "tune.md").read_text()  # quoted word for word
    (selection,) = _stored_outcome(store)["selections"]
    assert selection["edges"] == [
        {"path": "federation.lr", "value": 0.01, "side": "highest", "kind": "grid", "stop": None}
    ]
    report = fedhet("report", spec, "--tuned", "--train", "--out", tmp_path / "r", store=store)
    assert report.rc == 0, report.stderr
    (md,) = (tmp_path / "r").glob("*.md")
    section = md.read_text().split("## Tuning")[1].split("\n## ")[0]
    assert f"- {flag}the grid" in section and "| lr=0.01 highest |" in section
    before = _train_keys(store)

    plan = fedhet("plan", spec, "tune.extend_edges=1", "--tune", store=store)
    assert plan.rc == 0 and "6 stages: 4 stored, 2 missing" in plan.stdout  # 0.03, the outcome

    extended = fedhet(
        "tune", spec, "tune.extend_edges=1", "--trials", "--format", "json", store=store
    )
    assert extended.rc == 0, extended.stderr
    assert "tune: 3 trial runs, 0 not stored" in extended.stderr  # the stored trials, read
    assert "tune: 4 trial runs, 1 not stored" in extended.stderr
    assert extended.stderr.count("computing (FedAvg trial") == 1
    assert "computing (FedAvg trial 3 (lr=0.03), iid, seed 7)" in extended.stderr
    rows = json.loads(extended.stdout)
    assert [r["values"] for r in rows] == ["lr=0.001", "lr=0.003", "lr=0.01", "lr=0.03"]
    same = ("values", "val_score_pct", "keys")
    assert [[r[c] for c in same] for r in rows[:3]] == [[t[c] for c in same] for t in trials]
    assert _train_keys(store) > before and len(_train_keys(store) - before) == 1


def test_a_runoff_through_the_command_line_chooses_by_the_mean_over_every_seed(
    fedhet: CliRunner, tmp_path: Path
):
    data = copy.deepcopy(EDGE_SPEC)
    data["tune"]["runoff"] = {"seeds": [8], "within": 1.0}  # every trial is close: the top 2
    spec, store = write_spec(tmp_path / "runoff.yaml", data), tmp_path / "store"
    result = fedhet("tune", spec, "--trials", "--format", "json", store=store)
    assert result.rc == 0, result.stderr
    assert "tune: 3 trial runs, 3 not stored" in result.stderr
    assert "tune: 2 trial runs, 2 not stored" in result.stderr  # the runoff's, seed 8
    (selection,) = _stored_outcome(store)["selections"]
    trials = selection["trials"]
    ran = [t for t in trials if t["runoff_keys"]]
    by_score = sorted(trials, key=lambda t: -t["scores"][0])
    assert ran == sorted(by_score[:2], key=lambda t: t["number"])
    means = {t["number"]: (t["scores"][0] + t["runoff_scores"][0]) / 2 for t in ran}  # fractions
    assert trials[selection["chosen"]]["number"] == max(means, key=means.get)
    assert set(t["runoff_keys"][0] for t in ran) <= _train_keys(store)
    rows = json.loads(result.stdout)
    ran_runoff = [bool(t["runoff_keys"]) for t in trials]
    assert [r["runoff_score_pct"] is not None for r in rows] == ran_runoff
    shown = {r["trial"]: r["runoff_score_pct"] for r in rows if r["runoff_score_pct"]}
    assert shown == pytest.approx({n: 100 * m for n, m in means.items()})
