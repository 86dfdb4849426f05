"""The report's curves: a metric a method does not define is not drawn (centralized training's
weight divergence, which would be a flat line at 0), and TCT's stage boundary is marked."""

import numpy as np

from fedhet.core.spec import parse_spec
from fedhet.reports.report import seed_curves, stage_boundaries


def _row(algorithm: str, spec: dict, divergence: list[float]) -> dict:
    parsed = parse_spec(spec)
    return {
        "algorithm": algorithm,
        "setting": "s",
        "group": algorithm,
        "metrics": {"divergence": np.asarray(divergence)},
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
