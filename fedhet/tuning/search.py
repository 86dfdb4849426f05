"""A tune's search, wave by wave: every group's study asks its next trials, their runs are
measured together (trained, in parallel where asked, or only read), and each study is told its
trials' scores in trial order. With a pruner, a wave's trials first train to each rung in turn
(runs of that many rounds, which the longer runs continue), and the study stops those below the
median there. The waves depend on the spec alone, never on how the runs were computed, so the
same spec makes the same choices with any --jobs."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fedhet.core.tune_spec import TuneSpec
from fedhet.execution.planning import Run
from fedhet.tuning.groups import TuneGroup
from fedhet.tuning.samplers import Search
from fedhet.tuning.selection import run_score, trial_score

# The runs of a wave -> each run's validation curve by key (None: it diverged); None as a
# whole when some run has no result (a plan, which only reads the store)
Measure = Callable[[list[Run]], Mapping[str, list[float] | None] | None]


@dataclass
class Trial:
    group: TuneGroup
    number: int
    values: dict[str, Any]
    runs: list[Run] = field(default_factory=list)  # every rung's runs, then the full ones
    latest: list[Run] = field(default_factory=list)  # those it stopped at, one per seed
    scores: list[float] = field(default_factory=list)  # theirs, once measured
    pruned_at: int | None = None  # the rung it stopped at
    runoff: list[Run] = field(default_factory=list)  # its runs on the runoff's seeds, if any
    runoff_scores: list[float] = field(default_factory=list)

    @property
    def score(self) -> float:
        return trial_score(self.scores) if self.scores else math.nan

    @property
    def final_score(self) -> float:
        """Its score after all its rounds: NaN for a trial stopped early."""
        return math.nan if self.pruned_at is not None else self.score

    def train_to(self, rounds: int | None, seeds: list[int]) -> list[Run]:
        """Its runs of `rounds` rounds (None: the spec's), now its latest."""
        self.latest = self.group.trial_runs(self.number, self.values, seeds, rounds)
        self.runs += self.latest
        return self.latest


Wave = list[tuple[Search, Trial]]


def search(
    groups: list[TuneGroup], tune: TuneSpec, measure: Measure
) -> tuple[list[list[Trial]], bool]:
    """Every group's trials, in trial order, and whether the search is complete: all of them,
    or (when `measure` finds a run without a result) those of the waves up to that one."""
    studies = [Search(g, tune) for g in groups]
    trials: list[list[Trial]] = [[] for _ in groups]
    while True:
        wave: Wave = []
        for group, study, mine in zip(groups, studies, trials, strict=True):
            for number, values in study.ask():
                mine.append(Trial(group, number, values))
                wave.append((study, mine[-1]))
        if not wave:
            return trials, True
        if not _measured(wave, tune, measure):
            return trials, False


def _measured(wave: Wave, tune: TuneSpec, measure: Measure) -> bool:
    """Train (or read) the wave's trials rung by rung, then to their end, telling each study
    what becomes of them; False when a run has no result (a plan)."""
    live = wave
    for rounds in [*(tune.prune.rungs if tune.prune else []), None]:
        if not live:  # every trial of the wave stopped early
            return True
        runs = [run for _, trial in live for run in trial.train_to(rounds, tune.seeds)]
        curves = measure(runs)
        if curves is None:
            return False
        for _, trial in live:
            trial.scores = [run_score(curves[run.node.key], tune.metric) for run in trial.latest]
        if rounds is not None:
            live = [(study, trial) for study, trial in live if _goes_on(study, trial, rounds)]
    for study, trial in live:
        study.tell(trial.number, trial.score)
    return True


def _goes_on(study: Search, trial: Trial, rounds: int) -> bool:
    """Whether the trial trains on past rung `rounds`: not when it diverged (told so) or the
    study's pruner stops it there."""
    if math.isnan(trial.score):
        study.tell(trial.number, trial.score)
        return False
    if study.prunes(trial.number, trial.score, rounds):
        trial.pruned_at = rounds
        return False
    return True
