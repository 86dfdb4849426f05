"""The plateau rule of the long specs, as the report computes it: each run's mean test accuracy
over the evaluations of the last quarter of its rounds minus the quarter before, paired over
seeds; levelled off when the mean rise is within one point."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedhet.reports.plateau import early_pairs, plateau_section, quarters, rise, verdict


def curve(rounds: int, every: int, level) -> list[float]:
    """A test-accuracy curve evaluated every `every` rounds, `level(round)` where evaluated."""
    return [level(r) if r % every == 0 else math.nan for r in range(1, rounds + 1)]


def test_the_quarters_are_the_long_specs_windows():
    # vhl_fmnist_official_long: 65-90 vs 95-120 with evaluations every 5
    before, last = quarters(120)
    assert (before.start, before.stop - 1, last.start, last.stop - 1) == (61, 90, 91, 120)
    before, last = quarters(1000)  # fedimpro_fmnist_long: 505-750 vs 755-1000
    assert (before.start, last.start, last.stop - 1) == (501, 751, 1000)


def test_rise_is_the_mean_of_the_last_quarter_minus_the_quarter_before():
    accuracies = curve(120, 5, lambda r: r / 1000)
    # evaluations 65..90 (mean 77.5) and 95..120 (mean 107.5): a rise of 30 / 1000
    assert rise(accuracies) == pytest.approx(0.03)
    assert math.isnan(rise(curve(8, 100, lambda r: 0.5)))  # no evaluation in a window


def test_the_verdict_needs_a_mean_rise_under_one_point():
    assert verdict(0.0099) == "levelled off" and verdict(-0.0099) == "levelled off"
    assert verdict(0.0101) == "still rising" and verdict(-0.02) == "falling"


def row(seed: int, accuracies: list[float], diverged=None) -> dict:
    return {
        "seed": seed,
        "diverged": diverged,
        "metrics": {"test_accuracy": np.asarray(accuracies)},
    }


def test_the_section_pairs_over_seeds_and_names_each_verdict():
    flat = [row(s, curve(40, 2, lambda r, s=s: 0.8 + s / 1000)) for s in range(3)]
    rising = [row(s, curve(40, 2, lambda r, s=s: r / 100 + s / 1000)) for s in range(3)]
    broken = [row(0, [0.1, 0.2], diverged=3), *rising[1:]]
    section = plateau_section(
        {("fedavg", "s"): flat, ("vhl", "s"): rising, ("other", "s"): broken}, "fedavg"
    )
    header, *lines = [line for line in section.splitlines() if line.startswith("| ")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    assert section.startswith("## Has each curve levelled off?")  # every algorithm's rows
    assert "| mean rise (points) | 95% CI | per run (points) |" in header  # each with its unit
    assert "(fedavg first)" in section
    fedavg, vhl, other = cells
    assert fedavg[:5] == ["fedavg", "s", "21-30 vs 31-40", "3", "+0.00"]
    assert fedavg[-1] == "levelled off"
    assert vhl[4] == "+10.00" and vhl[-1] == "still rising"
    assert other[3] == "2"  # the diverged run is left out


def test_a_two_round_run_compares_round_two_with_round_one():
    assert quarters(2) == (range(1, 2), range(2, 3))
    assert rise([0.5, 0.7]) == pytest.approx(0.2)
    runs = [row(s, [0.5, 0.7 + s / 100]) for s in range(2)]
    (cells,) = table_rows(plateau_section({("fedavg", "s"): runs}, "fedavg"))
    # rises +20 and +21 points: every round evaluated, so never "no evaluation in a window"
    assert cells[2:6] == ["1 vs 2", "2", "+20.50", "[+14.15, +26.85]"]
    assert cells[-1] == "still rising"


def test_one_round_has_nothing_to_compare_with():
    before, _ = quarters(1)
    assert not before
    section = plateau_section({("fedavg", "s"): [row(0, [0.5])]}, "fedavg")
    assert table_rows(section) == [["fedavg", "s", "-", "-", "-", "-", "-", "too few rounds (1)"]]


def test_a_group_whose_every_run_diverged_says_so():
    section = plateau_section({("fedavg", "s"): [row(0, [0.1, 0.2, 0.3, 0.4], 5)]}, "fedavg")
    assert table_rows(section)[0][-1] == "every run diverged"


def table_rows(section: str) -> list[list[str]]:
    lines = [line for line in section.splitlines() if line.startswith("| ")][1:]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines]


def test_a_verdict_is_early_training_where_either_curve_of_its_pair_still_moves():
    flat = [row(s, curve(40, 2, lambda r, s=s: 0.8 + s / 1000)) for s in range(3)]
    rising = [row(s, curve(40, 2, lambda r, s=s: r / 100 + s / 1000)) for s in range(3)]
    cells = {
        ("fedavg", "iid"): flat,
        ("flat", "iid"): flat,
        ("late", "iid"): rising,  # the reference has levelled off; this one has not
        ("fedavg", "skew"): rising,
        ("flat", "skew"): flat,
    }
    assert early_pairs(cells, "fedavg") == {("late", "iid"), ("flat", "skew")}


def test_a_curve_not_judged_marks_no_pair_but_one_round_is_early():
    flat = [row(s, curve(40, 2, lambda r, s=s: 0.8 + s / 1000)) for s in range(3)]
    broken = [row(s, [0.1, 0.2], diverged=3) for s in range(3)]
    cells = {("fedavg", "s"): flat, ("broken", "s"): broken}
    assert early_pairs(cells, "fedavg") == set()  # every run diverged: not early training
    single = {("fedavg", "s"): [row(0, [0.5])], ("other", "s"): [row(0, [0.6])]}
    assert early_pairs(single, "fedavg") == {("other", "s")}
