"""The unit of every quantity fedhet shows, and the one place that converts to it.

Artifacts store accuracies (and shares) as fractions of 1, and keep doing so (their keys and
formats never change). Everything a person or an analysis reads shows them in percent: the
command line's tables and their CSV and JSON, `fedhet export`, the Python API's DataFrames,
reports and progress lines. A column of accuracies is named with `_pct` (`best_test_pct`,
`test_accuracy_pct`); a difference of two accuracies is in percentage points (`points`), and so
is the floor a verdict calls a gain. Every other quantity keeps its stored unit, which its name
says (`wall_time_s`) or which is a count (rounds, seeds, bytes). A spec's own fields (a dotted
path such as `eval.target_accuracy` in an export) are shown as the spec writes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Real
from typing import Any

import numpy as np

# The quantities stored as fractions of 1: the accuracies of a run's rounds, of its summary, of
# `fedhet eval` (one, or a list per class or client) and of `fedhet tune`'s validation scores;
# a partition's dominant-class share.
FRACTIONS = frozenset(
    {
        "test_accuracy",
        "val_accuracy",
        "ensemble_val_accuracy",
        "average_val_accuracy",
        "train_accuracy",
        "best_test",
        "test_at_best_val",
        "final",
        "best_val",
        "median_val",
        "val_score",
        "client_test_weighted_mean",
        "runoff_score",
        "target_accuracy",
        "accuracy",
        "global_accuracy",
        "own_angle",
        "client_test_mean",
        "client_test_worst_decile",
        "client_test_std",
        "per_class",
        "per_client",
        "client_test",
        "dominant_share",
    }
)
PERCENT = "_pct"  # the suffix of a column in percent
# The stored quantities whose names do not say their unit, and the suffix that does when shown
UNIT_SUFFIXES = {"wall_time": "_s"}
POINTS = "points"  # the unit of a difference of two accuracies: percentage points


def percent(fraction: float) -> float:
    """An accuracy stored as a fraction, in percent (or a difference of two, in points), to 10
    decimals: 0.7493 is 74.93, not 74.92999999999999, in a JSON or CSV a person pastes."""
    scaled = 100 * fraction
    return np.round(scaled, 10) if isinstance(scaled, np.ndarray) else round(scaled, 10)


def fraction(shown: float) -> float:
    """An accuracy in percent (or a difference in points) as stored: a fraction of 1."""
    return shown / 100


def shown_name(name: str) -> str:
    """The column that shows the stored quantity `name`: `best_test` -> `best_test_pct`,
    `wall_time` (a round's seconds) -> `wall_time_s`."""
    return name + PERCENT if name in FRACTIONS else name + UNIT_SUFFIXES.get(name, "")


def shown_value(name: str, value: Any) -> Any:
    """A stored value (or list of values) of the quantity `name` in its shown unit; text
    (`diverged 3/5`) and None stay as they are."""
    if name not in FRACTIONS:
        return value
    if isinstance(value, list):
        return [shown_value(name, v) for v in value]
    return percent(value) if isinstance(value, Real) and not isinstance(value, bool) else value


def shown_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row of stored quantities as shown, each under its shown name (`shown_name`): fractions
    in percent as `_pct`, a round's seconds as `wall_time_s`."""
    return {shown_name(name): shown_value(name, value) for name, value in row.items()}
