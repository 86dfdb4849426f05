"""Which trials a group runs, and which stop early: an Optuna study per group, driven by ask,
report and tell. A grid's points are enqueued in order (exact: each once); choices and ranges
are drawn by a seeded sampler (random, TPE); an optional MedianPruner stops a trial whose
validation score at a rung is below the median of the trials completed before. Trials are
asked in waves and told in trial order before the next wave is asked, so the study makes the
same choices however many trials run at once."""

from __future__ import annotations

import math
from typing import Any

from fedhet.core.tune_spec import Dimension, TuneSpec
from fedhet.tuning.groups import TuneGroup

Asked = list[tuple[int, dict[str, Any]]]  # (trial number, field path -> value)


class Search:
    def __init__(self, group: TuneGroup, tune: TuneSpec):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        samplers = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler}
        pruner = optuna.pruners.NopPruner()
        if tune.prune is not None:
            pruner = optuna.pruners.MedianPruner(n_startup_trials=tune.prune.startup_trials)
        self._study = optuna.create_study(
            direction="maximize",
            sampler=samplers.get(group.sampler, optuna.samplers.RandomSampler)(
                seed=tune.sampler_seed
            ),
            pruner=pruner,
        )
        if group.sampler == "grid":
            for point in group.grid_points():
                self._study.enqueue_trial(point)
        adaptive = group.sampler == "tpe" or tune.prune is not None  # results steer next waves
        self._space, self._budget = group.space, group.budget
        self._batch = tune.batch if adaptive else group.budget
        self._asked: dict[int, Any] = {}
        self._count = 0  # trials asked (the study also holds a grid's enqueued ones)

    def ask(self) -> Asked:
        """The next wave of trials; none when the budget is spent."""
        count = min(self._batch, self._budget - self._count)
        self._count += count
        asked = []
        for _ in range(count):
            trial = self._study.ask()
            self._asked[trial.number] = trial
            values = {path: _suggest(trial, path, d) for path, d in self._space.items()}
            asked.append((trial.number, values))
        return asked

    def prunes(self, number: int, score: float, rounds: int) -> bool:
        """Report trial `number`'s score after `rounds` rounds: whether it stops there (told)."""
        from optuna.trial import TrialState

        trial = self._asked[number]
        trial.report(score, rounds)
        if not trial.should_prune():
            return False
        self._study.tell(self._asked.pop(number), state=TrialState.PRUNED)
        return True

    def tell(self, number: int, score: float) -> None:
        """Trial `number`'s final score (NaN: it diverged)."""
        from optuna.trial import TrialState

        trial = self._asked.pop(number)
        if math.isnan(score):
            self._study.tell(trial, state=TrialState.FAIL)
        else:
            self._study.tell(trial, score)


def _suggest(trial: Any, path: str, dimension: Dimension) -> Any:
    listed = dimension.grid if dimension.grid is not None else dimension.choice
    if listed is not None:  # by index: a value may be any YAML value, e.g. a list
        return listed[trial.suggest_categorical(path, list(range(len(listed))))]
    low, high = dimension.range
    return trial.suggest_float(path, low, high, log=dimension.log_uniform is not None)
