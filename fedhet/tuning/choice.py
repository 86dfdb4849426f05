"""Each group's choice: the search's best trial (fedhet.tuning.search), with two optional steps
after it. `extend_edges: N`: a grid whose chosen value is its lowest or highest gains the next
value past it (fedhet.tuning.edges) and the search runs again over the grown grid, up to N
times a group, until the choice lies inside. `runoff`: once no grid grows, the trials as close
to the best as the spec says also run the runoff's seeds, and the highest mean over all their
seeds is chosen (fedhet.tuning.selection); a runoff that moves the choice onto an edge extends
that grid in turn. Every step measures ordinary runs through the same `measure`, so the
runs already stored are read, never trained again, and a plan (which only reads) goes as far
as the stored results decide."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedhet.core.tune_spec import TuneSpec
from fedhet.tuning.edges import Edge, edges_of, past
from fedhet.tuning.groups import TuneGroup
from fedhet.tuning.search import Measure, Trial, search
from fedhet.tuning.selection import best_trial, close_trials, run_score, runoff_winner, trial_score


@dataclass
class Choice:
    group: TuneGroup  # as last searched: its grids with the values added past an edge
    trials: list[Trial]
    chosen: int | None = None  # index into trials; None: undecided, or no trial ran to the end
    added: dict[str, list[Any]] = field(default_factory=dict)  # field -> values added, in order
    stops: dict[tuple[str, str], str] = field(default_factory=dict)  # (field, side) -> why not
    extensions: int = 0  # the times its grids grew

    def choose(self) -> None:
        self.chosen = best_trial([trial.final_score for trial in self.trials])

    def grid_edges(self) -> list[Edge]:
        """The edges of the choice in the group's grids."""
        if self.chosen is None:
            return []
        kinds = {path: dimension.kind for path, dimension in self.group.space.items()}
        tried = [trial.values for trial in self.trials]
        edges = edges_of(kinds, tried, self.trials[self.chosen].values)
        return [edge for edge in edges if edge.kind == "grid"]

    def extend(self, edge: Edge) -> bool:
        """Add the grid value past the edge; False (and why, in `stops`) when it cannot be."""
        grid = self.group.space[edge.path].grid or []
        value = past(grid, edge.side)
        invalid = self.group.refusal({edge.path: value})
        if value in grid or invalid:
            why = "is tried already" if value in grid else f"gives an invalid run ({invalid})"
            self.stops[edge.path, edge.side] = f"the next value, {value!r}, {why}"
            return False
        self.group = self.group.with_value(edge.path, value)
        self.added.setdefault(edge.path, []).append(value)
        return True


def choose(groups: list[TuneGroup], tune: TuneSpec, measure: Measure) -> tuple[list[Choice], bool]:
    """Every group's choice, and whether it is complete (a plan may stop before)."""
    searched, complete = search(groups, tune, measure)
    choices = [Choice(group, trials) for group, trials in zip(groups, searched, strict=True)]
    while complete:
        for choice in choices:
            choice.choose()
        if not _extended(choices, tune):
            if not _runoff(choices, tune, measure):
                return choices, False
            if not _extended(choices, tune):
                return choices, True
        searched, complete = search([c.group for c in choices], tune, measure)
        for choice, trials in zip(choices, searched, strict=True):
            choice.trials = trials
    return choices, False


def _extended(choices: list[Choice], tune: TuneSpec) -> bool:
    """Whether a grid grew past its choice's edge; a group at `tune.extend_edges` extensions
    records that limit instead."""
    grown = False
    for choice in choices:
        edges = choice.grid_edges() if tune.extend_edges else []
        if edges and choice.extensions == tune.extend_edges:
            limit = f"the grid was extended {choice.extensions} times, tune.extend_edges's limit"
            for edge in edges:
                choice.stops.setdefault((edge.path, edge.side), limit)
        elif any([choice.extend(edge) for edge in edges]):  # a list: every edge, not the first
            choice.extensions += 1
            grown = True
    return grown


def _runoff(choices: list[Choice], tune: TuneSpec, measure: Measure) -> bool:
    """Close trials run the runoff's seeds and the best mean over all seeds is chosen; False
    when a runoff run has no result (a plan)."""
    if tune.runoff is None:
        return True
    close = {}
    for index, choice in enumerate(choices):
        if choice.chosen is None:
            continue
        scores = [trial.final_score for trial in choice.trials]
        best_seeds = choice.trials[choice.chosen].scores
        numbers = close_trials(scores, best_seeds, tune.runoff.within, tune.runoff.candidates)
        if not numbers:  # a clear best: chosen as it is
            continue
        close[index] = numbers
        for trial in (choice.trials[i] for i in numbers):
            trial.runoff = choice.group.trial_runs(trial.number, trial.values, tune.runoff.seeds)
            trial.runs += trial.runoff
    runs = [run for choice in choices for trial in choice.trials for run in trial.runoff]
    curves = measure(runs) if runs else {}
    if curves is None:
        return False
    for index, numbers in close.items():
        trials = [choices[index].trials[i] for i in numbers]
        for trial in trials:
            trial.runoff_scores = [run_score(curves[r.node.key], tune.metric) for r in trial.runoff]
        means = [trial_score([*trial.scores, *trial.runoff_scores]) for trial in trials]
        choices[index].chosen = runoff_winner(numbers, means)
    return True
