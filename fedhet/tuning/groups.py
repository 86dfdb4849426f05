"""What a tune selects over: a group per method and setting (the spec's runs that differ only in
their seed), and the runs of its trials, each the group's run with the trial's values applied
and the selection seed: an ordinary run, with that run's keys."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any

from fedhet.core.errors import InputError
from fedhet.core.spec import Spec, parse_run
from fedhet.core.tune_spec import Dimension, Space, TuneSpec, with_values
from fedhet.execution.planning import Run, group_key, plan, runs_of


@dataclass(frozen=True)
class TuneGroup:
    method: str  # the algorithm's name, as tune.methods names it
    algorithm_label: str  # the group's row and column in a report
    setting_label: str
    runs: list[Run]  # the spec's runs of the group: its evaluation seeds
    space: Space
    budget: int
    sampler: str
    # a grid's points (field path -> index of its value) in trial order; None: the product of
    # the grids, the last field fastest. A grid extended past an edge adds its points after them
    points: list[dict[str, int]] | None = None

    @property
    def key(self) -> str:
        return self.runs[0].group

    def grid_points(self) -> list[dict[str, int]]:
        return grid_points(self.space) if self.points is None else self.points

    def with_value(self, path: str, value: Any) -> TuneGroup:
        """The group with one more value in the grid of `path`: its new points come last."""
        grid = [*(self.space[path].grid or []), value]
        space = {**self.space, path: Dimension(grid=grid)}
        known = self.grid_points()
        points = known + [p for p in grid_points(space) if p not in known]
        return dataclasses.replace(self, space=space, budget=len(points), points=points)

    def refusal(self, values: dict[str, Any]) -> str | None:
        """Why a trial with these values is no valid run of the group (None: it is)."""
        try:
            with_values(self.runs[0].spec, values, parse_run, self.algorithm_label)
        except InputError as error:
            return str(error)
        return None

    def trial_runs(
        self, number: int, values: dict[str, Any], seeds: list[int], rounds: int | None = None
    ) -> list[Run]:
        """The runs of trial `number`, one per selection seed; of `rounds` rounds when given
        (a rung: the first rounds of the full runs, which continue them)."""
        shortened = {} if rounds is None else {"federation.rounds": rounds}
        at = "" if rounds is None else f", {rounds} rounds"
        label = f"{self.algorithm_label} trial {number} ({values_label(values)}{at})"
        return [
            _run(self.runs[0], {**values, **shortened, "seed": seed}, label, self.setting_label)
            for seed in seeds
        ]

    def tuned_runs(self, values: dict[str, Any]) -> list[Run]:
        """The group's runs (its evaluation seeds) with the chosen values, under its labels."""
        return [_run(run, values, self.algorithm_label, self.setting_label) for run in self.runs]


def tune_groups(spec: Spec, tune: TuneSpec) -> list[TuneGroup]:
    """A group per method and setting, in the spec's run order."""
    members: dict[str, list[Run]] = {}
    for run in runs_of(spec):
        members.setdefault(run.group, []).append(run)
    return [_group(runs, tune) for runs in members.values()]


def _group(runs: list[Run], tune: TuneSpec) -> TuneGroup:
    method = runs[0].spec.algorithm.name
    return TuneGroup(
        method,
        runs[0].algorithm_label,
        runs[0].setting_label,
        runs,
        tune.space_of(method),
        tune.budget_of(method),
        tune.sampler_of(method),
    )


def _run(run: Run, values: dict[str, Any], algorithm_label: str, setting_label: str) -> Run:
    spec = with_values(run.spec, values, parse_run, f"{run.label} with {values_label(values)}")
    return Run(run.axes, spec, plan(spec), group_key(spec), algorithm_label, setting_label)


def grid_points(space: Space) -> list[dict[str, int]]:
    """Every point of a grid space by its values' indices, the last field varying fastest."""
    paths = list(space)
    ranges = [range(len(space[path].grid or [])) for path in paths]
    return [dict(zip(paths, combo, strict=True)) for combo in itertools.product(*ranges)]


def values_label(values: dict[str, Any]) -> str:
    """`lr=0.1, mu=0.001`: each field by its name within its section, a float in 4 digits."""
    return ", ".join(
        f"{path.split('.', 1)[-1]}={f'{value:.4g}' if isinstance(value, float) else value}"
        for path, value in values.items()
        if path != "seed"
    )
