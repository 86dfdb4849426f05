"""The report's curves and costs: a metric a method does not define is not drawn (centralized
training's weight divergence, which would be a flat line at 0), TCT's stage boundary is marked,
and the cost per round leaves out each run's warm-up round."""

import numpy as np

from fedhet.core.spec import parse_spec
from fedhet.reports.report import seed_curves, stage_boundaries
from fedhet.reports.tables import after_warm_up, cost_table, uneven_round_times


def _row(algorithm: str, spec: dict, divergence: list[float]) -> dict:
    parsed = parse_spec(spec)
    return {
        "algorithm": algorithm,
        "setting": "s",
        "group": algorithm,
        "metrics": {"divergence": np.asarray(divergence)},
        "diverged": None,
        "undefined": parsed.algorithm.undefined_metrics,
        "stage_starts": parsed.algorithm.stage_starts(parsed),
    }


def test_undefined_metrics_are_not_drawn_and_tct_marks_its_stage_two():
    rounds = {"federation": {"rounds": 6}}
    tct = {**rounds, "algorithm": {"name": "tct", "stage1": {"rounds": 4}, "stage2": {"rounds": 2}}}
    rows = [
        _row("fedavg", {**rounds, "algorithm": {"name": "fedavg"}}, [0.3] * 6),
        _row("centralized", {**rounds, "algorithm": {"name": "centralized"}}, [0.0] * 6),
        _row("tct", tct, [0.2] * 6),
    ]
    curves = seed_curves(rows, "divergence")["s"]
    assert np.isnan(curves["centralized"].mean).all()
    assert np.allclose(curves["fedavg"].mean, 0.3)
    assert stage_boundaries(rows) == {"tct": [4]}


def _timed(algorithm: str, seconds: list[float]) -> dict:
    metrics = {name: np.ones(len(seconds)) for name in ("bytes_up", "bytes_down", "comm_rounds")}
    return {
        "algorithm": algorithm,
        "setting": "s",
        "group": algorithm,
        "metrics": {**metrics, "wall_time": np.asarray(seconds)},
    }


def test_the_cost_per_round_leaves_out_each_runs_first_round():
    # fedavg's first run holds the process's warm-up in its first round (3.1 s against 0.5 s)
    rows = [_timed("fedavg", [3.1, 0.5, 0.5]), _timed("fedprox", [0.6, 1.0, 1.0])]
    table = cost_table(rows).splitlines()
    cells = {line.split(" | ")[0][2:]: line.split(" | ")[3:5] for line in table[2:]}
    assert cells == {"fedavg": ["0.500", "1.00"], "fedprox": ["1.000", "2.00"]}
    assert list(after_warm_up(np.array([2.0]))) == [2.0]  # one round: all there is


def test_runs_of_one_configuration_far_apart_in_time_are_flagged():
    """fedbr_fmnist_skew_momentum's FedAvg runs took 1.05 to 8.34 s a round (median per run):
    the same work under another load; seeds 10% apart are the ordinary spread."""
    even = [_timed("fedavg", [3.0, 1.0, 1.1, 1.0]), _timed("fedavg", [3.0, 1.1, 1.1, 1.05])]
    assert uneven_round_times(even) == ""
    loaded = [*even, _timed("fedprox", [0.6, 1.0, 1.0]), _timed("fedprox", [0.6, 8.3, 8.4])]
    line = uneven_round_times(loaded)
    assert line.startswith("Caution: in 1 of 2 groups")
    assert "(the most: fedprox, s, 1.00 to 8.35 s)" in line


def test_a_run_that_diverged_in_round_one_has_no_round_time_to_compare(recwarn):
    """Its row holds no rounds (nothing before the divergence): no median, and no warning."""
    rows = [_timed("fedavg", [3.0, 1.0, 1.1]), _timed("fedavg", [])]
    assert uneven_round_times(rows) == ""
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
