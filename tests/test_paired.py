"""Paired statistics of a report: per-seed differences against a reference, their Student t
interval and verdict (checked against hand-computed values), the per-run metrics they pair
(means over evaluated rounds), how diverged and never-reaching runs are left out, and
`fedhet report --baseline` end to end."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_SPEC, CliRunner, markdown_tables, write_spec

from fedhet.core.spec import parse_spec
from fedhet.core.store import ArtifactStore
from fedhet.execution.planning import runs_of
from fedhet.metrics.paired import Pairing, compare, pair
from fedhet.metrics.summary import evaluated_mean, summarize, tail_mean
from fedhet.reports.comparison import (
    EARLY,
    PairedRow,
    compared,
    describe_rounds,
    paired_metrics,
    paired_table,
)

# Student t quantiles t(0.975, df). With df = 2 the distribution function is
# 1/2 + t / (2 sqrt(2 + t^2)), so t(p, 2) = (2p - 1) / sqrt(2p(1 - p)) exactly; df = 3 from a table.
T_975_DF2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)
T_975_DF3 = 3.182446305284263

# --- the statistics ---------------------------------------------------------------------------


def test_known_differences_give_the_hand_computed_interval_and_stay_within_noise():
    paired = pair({0: 2.0, 1: 4.0, 2: 6.0}, {0: 1.0, 1: 2.0, 2: 3.0})
    assert paired.seeds == (0, 1, 2) and paired.differences == (1.0, 2.0, 3.0)
    result = compare(paired.differences)
    # mean 2, sd (ddof=1) 1, half-width t(0.975, 2) * 1 / sqrt(3) = 2.4841
    half = T_975_DF2 / math.sqrt(3)
    assert T_975_DF2 == pytest.approx(4.302652729, abs=1e-9)
    assert result.mean == 2.0 and half == pytest.approx(2.4841, abs=1e-4)
    assert result.low == pytest.approx(2.0 - half, rel=1e-9)
    assert result.high == pytest.approx(2.0 + half, rel=1e-9)
    assert (result.n, result.ahead, result.verdict) == (3, 3, "within noise")


def test_a_clearly_better_algorithm_is_ahead():
    result = compare([1.0, 1.2, 0.8])  # mean 1, sd 0.2: 1 -+ 4.3027 * 0.2 / sqrt(3) = 0.4968
    assert result.low == pytest.approx(1.0 - T_975_DF2 * 0.2 / math.sqrt(3), rel=1e-9)
    assert result.low == pytest.approx(0.5032, abs=1e-4)
    assert (result.ahead, result.verdict) == (3, "ahead")


def test_a_clearly_worse_algorithm_is_behind_with_df_3():
    result = compare([-2.0, -1.0, -3.0, -2.0])  # mean -2, sd sqrt(2/3), n = 4
    half = T_975_DF3 * math.sqrt(2 / 3) / 2
    assert result.mean == -2.0
    assert (result.low, result.high) == pytest.approx((-2.0 - half, -2.0 + half), rel=1e-9)
    assert result.high == pytest.approx(-0.7008, abs=1e-4)
    assert (result.ahead, result.verdict) == (0, "behind")


def test_one_seed_gives_a_mean_but_no_interval():
    result = compare(pair({7: 0.9}, {7: 0.8}).differences)
    assert result.mean == pytest.approx(0.1) and (result.low, result.high) == (None, None)
    assert (result.n, result.ahead, result.verdict) == (1, 1, "too few seeds")
    nothing = compare([])
    assert math.isnan(nothing.mean) and (nothing.n, nothing.verdict) == (0, "too few seeds")


def test_ties_are_not_ahead_and_a_zero_interval_is_within_noise():
    result = compare([0.0, 0.0, 0.0])  # e.g. two algorithms that are the same computation
    assert (result.low, result.high, result.ahead, result.verdict) == (0, 0, 0, "within noise")


def test_pairs_only_seeds_both_have_and_counts_the_rest_by_reason():
    paired = pair(
        {0: 0.5, 1: "diverged", 2: 0.7, 3: "never reached", 4: 0.1},
        {0: 0.4, 1: 0.6, 2: "diverged", 3: "never reached", 5: 0.2},
    )
    assert paired.seeds == (0,) and paired.differences == pytest.approx((0.1,))
    assert paired.left_out == {
        "algorithm diverged": 1,
        "reference diverged": 1,
        "both never reached": 1,
        "unmatched": 2,  # seeds 4 and 5
    }


def test_lower_is_better_orients_differences_so_that_positive_favours_the_algorithm():
    paired = pair({0: 7.0, 1: 12.0}, {0: 10.0, 1: 10.0}, higher_is_better=False)
    assert paired.differences == (3.0, -2.0)  # rounds saved: reference minus algorithm


# --- the per-run metrics ----------------------------------------------------------------------


def test_means_skip_rounds_without_evaluation_and_the_tail_is_the_last_tenth():
    nan = math.nan
    every_other = [nan, 0.1, nan, 0.2, nan, 0.3]  # 3 evaluated rounds: the tail is the last one
    assert evaluated_mean(every_other) == pytest.approx(0.2)
    assert tail_mean(every_other) == 0.3
    accuracies = [nan] + [r / 100 for r in range(1, 26)]  # 25 evaluated: the last 25 // 10 = 2
    assert tail_mean(accuracies) == pytest.approx((0.24 + 0.25) / 2)
    assert evaluated_mean(accuracies) == pytest.approx(0.13)
    assert math.isnan(tail_mean([nan, nan])) and math.isnan(evaluated_mean([]))


def row(seed: int, accuracies: list[float], diverged: int | None = None, algorithm="a") -> dict:
    """A report row (report.collect's fields that pairing reads) from a test-accuracy curve."""
    zeros = [0.0] * len(accuracies)
    summary = summarize(
        {"test_accuracy": accuracies, "bytes_up": zeros, "bytes_down": zeros, "wall_time": zeros},
        target=0.5,
    )
    metrics = {"test_accuracy": np.asarray(accuracies)}
    return {
        **summary,
        "algorithm": algorithm,
        "seed": seed,
        "diverged": diverged,
        "metrics": metrics,
    }


def comparisons(cells: dict) -> dict[str, tuple]:
    """Metric title -> (differences, left out) of the one compared row."""
    out = {}
    for metric in paired_metrics(target=0.5):
        (only,) = compared(cells, "ref", metric)
        out[metric.title.split(" (")[0]] = only.pairing.differences, only.pairing.left_out
    return out


def test_a_diverged_run_keeps_what_it_reached_and_is_left_out_of_the_rest():
    reference = [row(s, [0.3, 0.4, 0.5, 0.6], algorithm="ref") for s in (0, 1)]
    algorithm = [
        row(0, [0.35, 0.45, 0.55, 0.7]),
        row(1, [0.2, 0.55], diverged=3),  # its rounds before diverging in round 3
    ]
    found = comparisons({("ref", "s"): reference, ("a", "s"): algorithm})
    best, best_left_out = found["Best test accuracy"]
    assert best == pytest.approx((0.1, -0.05)) and best_left_out == {}
    last_tenth = "Mean test accuracy over the last tenth of the rounds both evaluated"
    for title in (
        "Final test accuracy",
        last_tenth,
        "Mean test accuracy over the rounds both evaluated",
    ):
        differences, left_out = found[title]
        assert len(differences) == 1 and left_out == {"algorithm diverged": 1}
    assert found["Final test accuracy"][0] == pytest.approx((0.1,))
    # seed 0: (0.35 + 0.45 + 0.55 + 0.7) / 4 - (0.3 + 0.4 + 0.5 + 0.6) / 4 = 0.5125 - 0.45
    assert found["Mean test accuracy over the rounds both evaluated"][0] == pytest.approx((0.0625,))
    # it reached 50% in round 2, before diverging: 3 - 2 rounds saved; seed 0: 3 - 3
    assert found["Rounds to 50.00% test accuracy, over the rounds both evaluated"] == (
        (0.0, 1.0),
        {},
    )


def test_a_run_that_never_reaches_the_target_is_left_out_of_the_rounds_and_counted():
    reference = [row(s, [0.3, 0.5, 0.6], algorithm="ref") for s in (0, 1, 2)]
    algorithm = [row(0, [0.5, 0.6, 0.7]), row(1, [0.3, 0.4, 0.45]), row(2, [0.2, 0.3, 0.4], 3)]
    differences, left_out = comparisons({("ref", "s"): reference, ("a", "s"): algorithm})[
        "Rounds to 50.00% test accuracy, over the rounds both evaluated"
    ]
    assert differences == (1.0,)  # seed 0: reached in round 1, the reference in round 2
    assert left_out == {"algorithm never reached": 1, "algorithm diverged": 1}


def test_a_method_that_skips_early_evaluations_is_paired_over_the_rounds_both_evaluated():
    """TCT's stage 1 has no test accuracy: over all of FedAvg's rounds its early, low rounds
    would count against FedAvg alone (the audit's "+3.33, ahead" for a method behind on every
    seed). Over the rounds both evaluated, the late method is behind, as by best and final."""
    nan = math.nan
    reference = [row(s, [0.5, 0.6, 0.7, 0.8 + s / 100, 0.85], algorithm="ref") for s in (0, 1, 2)]
    late = [row(s, [nan, nan, nan, 0.76 + s / 200, 0.79 + s / 100]) for s in (0, 1, 2)]
    cells = {("ref", "s"): reference, ("a", "s"): late}
    by_title = {m.title: m for m in paired_metrics(target=0.75)}
    whole = by_title["Mean test accuracy over the rounds both evaluated (area under the curve)"]
    (result,) = compared(cells, "ref", whole)
    # seed 0: (0.76 + 0.79) / 2 - (0.8 + 0.85) / 2 = -0.05; the old mean over all rounds: +0.085
    assert result.pairing.differences[0] == pytest.approx(-0.05)
    assert result.comparison.verdict == "behind" and result.rounds == "4-5 (2)"
    for title in ("Best test accuracy (the papers' metric)", "Final test accuracy"):
        (other,) = compared(cells, "ref", by_title[title])
        assert other.comparison.verdict == "behind" and other.rounds == ""
    # rounds to 75%: the reference reaches it in round 4 of the shared rounds, not round 3
    to_target = next(m for m in by_title.values() if m.unit == "rounds")
    (rounds,) = compared(cells, "ref", to_target)
    assert rounds.pairing.differences == (0.0, 0.0, 0.0)


def test_rounds_shared_by_the_pairs_are_named():
    assert describe_rounds([frozenset(range(5, 121, 5))] * 3) == "5-120 every 5 (24)"
    assert (
        describe_rounds([frozenset({6, 7, 8}), frozenset({6, 7})]) == "per seed: 6-7 (2); 6-8 (3)"
    )
    assert describe_rounds([frozenset()]) == "none"


def test_a_difference_below_the_floor_is_negligible_not_ahead():
    tiny = [-0.0004, -0.0006, -0.0005, -0.00055]  # FedProx's -0.05 points, consistently
    assert compare(tiny).verdict == "behind"  # no floor: the interval alone
    assert compare(tiny, floor=0.005).verdict == "negligible"
    clear = [0.01, 0.012, 0.011]
    assert compare(clear, floor=0.005).verdict == "ahead"
    assert compare([-0.01, 0.012, 0.001], floor=0.005).verdict == "within noise"
    # the report's default floor is half a point
    reference = [row(s, [0.5, 0.6 + s / 100], algorithm="ref") for s in (0, 1, 2)]
    close = [row(s, [0.5, 0.6 + s / 100 + 0.001 + s / 10000]) for s in (0, 1, 2)]
    best = paired_metrics(target=None)[0]
    (result,) = compared({("ref", "s"): reference, ("a", "s"): close}, "ref", best)
    assert result.comparison.low > 0 and result.comparison.verdict == "negligible"
    (strict,) = compared({("ref", "s"): reference, ("a", "s"): close}, "ref", best, floor=0.0)
    assert strict.comparison.verdict == "ahead"


# --- fedhet report --baseline -----------------------------------------------------------------


def paired_tables(report: str, reference: str) -> list[list[list[str]]]:
    """The tables of the report's section of paired differences against `reference`."""
    section = report.split(f"\n## Paired differences against {reference}\n")[1]
    return markdown_tables(section.split("\n## ")[0].splitlines())


def test_report_pairs_with_the_first_algorithm_or_the_baseline_and_refuses_an_unknown_one(
    fedhet: CliRunner, tmp_path: Path
):
    spec_dict = {
        **TINY_SPEC,
        "name": "paired",
        "eval": {"target_accuracy": 0.3},
        "runtime": {"threads": 1, "progress": False, "device": "cpu"},
        "matrix": {
            "algorithm": [{"name": "fedavg"}, {"name": "fedprox", "mu": 1.0}],
            "seed": [0, 1, 2],
        },
    }
    spec, store, out = write_spec(tmp_path / "paired.yaml", spec_dict), tmp_path / "s", tmp_path
    first = fedhet("report", spec, "--out", out, "--train", store=store)
    assert first.rc == 0, first.stderr
    assert "Paired differences against FedAvg" in first.stdout  # among the sections named
    text = (out / "paired.md").read_text()
    tables = paired_tables(text, "FedAvg")
    assert len(tables) == 5  # best, final, last tenth, all rounds, rounds to target
    best = tables[0]
    assert best[0][:4] == ["algorithm", "setting", "pairs", "mean difference (points)"]
    (fedprox,) = best[2:]
    assert fedprox[:3] == ["FedProx", "alpha=0.5", "3"]
    stored, runs = ArtifactStore(store), runs_of(parse_spec(spec_dict))
    bests = {
        (run.algorithm_label, run.spec.seed): np.nanmax(
            stored.open("train", run.node.key)["metrics"]["test_accuracy"][:]
        )
        for run in runs
    }
    differences = [bests["FedProx", s] - bests["FedAvg", s] for s in (0, 1, 2)]
    assert fedprox[3] == f"{100 * np.mean(differences):+.2f}"
    assert fedprox[5] == f"{sum(d > 0 for d in differences)}/3"
    # marked early training exactly where the report's own plateau test finds either curve of
    # the pair, FedAvg's or FedProx's, still moving
    plateau = text.split("## Has each curve levelled off?", 1)[1].splitlines()
    pair = ("FedAvg", "FedProx")
    rises = [next(line for line in plateau if line.startswith(f"| {a} |")) for a in pair]
    settled = all(rise.rstrip(" |").endswith("levelled off") for rise in rises)
    early = "" if settled else " (early training)"
    assert fedprox[6] == compare(differences).verdict + early
    assert compare(differences).verdict != "too few seeds"

    unknown = fedhet("report", spec, "--out", out, "--baseline", "nosuch", store=store)
    assert unknown.rc == 2 and "Traceback" not in unknown.stderr
    (line,) = unknown.stderr.strip().splitlines()
    assert "--baseline 'nosuch'" in line and line.endswith("choose one of: 'FedAvg', 'FedProx'")

    swapped = fedhet("report", spec, "--out", out, "--baseline", "FedProx", store=store)
    assert swapped.rc == 0 and "note:" not in swapped.stderr, swapped.stderr
    text = (out / "paired.md").read_text()
    assert "## Rounds to FedProx's best accuracy" in text
    (fedavg,) = paired_tables(text, "FedProx")[0][2:]
    assert fedavg[:4] == ["FedAvg", "alpha=0.5", "3", f"{-100 * np.mean(differences):+.2f}"]
    # a label as written before labels took the papers' spelling: the same report, and a note
    old_style = fedhet("report", spec, "--out", out, "--baseline", "fedprox", store=store)
    assert old_style.rc == 0, old_style.stderr
    assert "note: --baseline 'fedprox' read as 'FedProx'" in old_style.stderr
    assert (out / "paired.md").read_text().split("Generated")[1] == text.split("Generated")[1]


def test_the_early_training_mark_qualifies_verdicts_with_an_interval_only():
    """A moving pair marks its verdict; a pair with one seed has no verdict to qualify."""
    rows = [
        PairedRow(name, "iid", Pairing(seeds, diffs, {}), compare(diffs))
        for name, seeds, diffs in (
            ("three", (0, 1, 2), (0.02, 0.03, 0.025)),
            ("one", (0,), (0.02,)),
        )
    ]
    early = {("three", "iid"), ("one", "iid")}
    table = markdown_tables(paired_table(rows, "points", early).splitlines())
    verdicts = {row[0]: row[6] for row in table[0][2:]}
    assert verdicts == {"three": "ahead" + EARLY, "one": "too few seeds"}
