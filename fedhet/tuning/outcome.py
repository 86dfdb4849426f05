"""A tune's outcome, an artifact of the store (`tune/<key>.zarr`, all in its attributes): for each
method and setting its space, sampler and budget, every trial's values, run keys and validation
scores, and the chosen trial. Its key hashes the tune section and the groups' keys: what decides
every trial (the trials' own runs are stored under theirs, its `upstream`)."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from fedhet.core.errors import InputError, RunError
from fedhet.core.keys import stage_key
from fedhet.core.spec import Spec
from fedhet.core.store import ArtifactStore
from fedhet.core.tune_spec import TuneSpec
from fedhet.tuning.groups import TuneGroup
from fedhet.tuning.search import Trial
from fedhet.tuning.selection import best_trial, trial_score

STAGE, VERSION = "tune", 1


@dataclass(frozen=True)
class TrialRecord:
    number: int
    values: dict[str, Any]
    keys: list[str]  # its runs' keys, one per selection seed (a pruned trial's: at its rung)
    scores: list[float | None]  # theirs; None: the run diverged or was never evaluated
    pruned_at: int | None = None  # the rung (round) the pruner stopped it at

    @property
    def score(self) -> float:
        return trial_score([math.nan if s is None else s for s in self.scores])

    @property
    def final_score(self) -> float:
        """Its score after all its rounds: NaN for a trial stopped early."""
        return math.nan if self.pruned_at is not None else self.score


@dataclass(frozen=True)
class Selection:
    """One method in one setting: what was searched, every trial, and the one chosen."""

    method: str
    algorithm: str
    setting: str
    group: str
    sampler: str
    budget: int
    space: dict[str, str]  # field -> its values as the spec gives them
    trials: list[TrialRecord]
    chosen: int  # index into trials

    @property
    def values(self) -> dict[str, Any]:
        return self.trials[self.chosen].values

    @property
    def best(self) -> float:
        return self.trials[self.chosen].score

    @property
    def median(self) -> float:
        """The median score over the trials that ran all their rounds (the sensitivity is
        best - median)."""
        scores = [t.final_score for t in self.trials]
        return statistics.median(s for s in scores if not math.isnan(s))

    @property
    def pruned(self) -> int:
        return sum(t.pruned_at is not None for t in self.trials)


@dataclass(frozen=True)
class TuneOutcome:
    key: str
    metric: str
    seeds: list[int]
    selections: list[Selection]


def _config(tune: TuneSpec, group_keys: list[str]) -> dict[str, Any]:
    return {"tune": tune.model_dump(mode="json"), "groups": group_keys}


def tune_key(tune: TuneSpec, groups: list[TuneGroup]) -> str:
    return stage_key(STAGE, VERSION, _config(tune, [g.key for g in groups]), {})


def outcome_of(
    key: str, tune: TuneSpec, groups: list[TuneGroup], searched: list[list[Trial]]
) -> TuneOutcome:
    """The outcome of a complete search; RunError when every trial of a group diverged."""
    selections = []
    for group, trials in zip(groups, searched, strict=True):
        records = [
            TrialRecord(
                t.number,
                t.values,
                [run.node.key for run in t.latest],
                [None if math.isnan(s) else s for s in t.scores],
                t.pruned_at,
            )
            for t in trials
        ]
        chosen = best_trial([r.final_score for r in records])
        if chosen is None:
            raise RunError(
                f"tune: no trial of {group.algorithm_label} ({group.setting_label}) ran all its "
                "rounds without diverging; narrow its space (e.g. smaller learning rates)"
            )
        space = {path: d.describe() for path, d in group.space.items()}
        selections.append(
            Selection(
                group.method,
                group.algorithm_label,
                group.setting_label,
                group.key,
                group.sampler,
                group.budget,
                space,
                records,
                chosen,
            )
        )
    return TuneOutcome(key, tune.metric, list(tune.seeds), selections)


def write_outcome(store: ArtifactStore, outcome: TuneOutcome, spec: Spec, tune: TuneSpec) -> None:
    import optuna

    upstream = {
        f"{s.algorithm}, {s.setting}, trial {t.number}, seed {seed}": key
        for s in outcome.selections
        for t in s.trials
        for seed, key in zip(outcome.seeds, t.keys, strict=True)
    }
    attrs = {
        "config": _config(tune, [s.group for s in outcome.selections]),
        "version": VERSION,
        "upstream": upstream,
        "spec_name": spec.name,
        "label": f"tune of {spec.name}",
        "spec": spec.model_dump(mode="json", serialize_as_any=True),
        "optuna": optuna.__version__,
        "tune": asdict(outcome),
    }
    with store.lock(STAGE, outcome.key):
        if not store.exists(STAGE, outcome.key):
            with store.write(STAGE, outcome.key, attrs):
                pass


def read_outcome(store: ArtifactStore, key: str, spec_path: str) -> TuneOutcome:
    """The stored outcome; InputError naming the command that computes it when there is none."""
    if not store.exists(STAGE, key):
        raise InputError(
            f"the tune of {spec_path} is not stored (tune {key[:12]}); run "
            f"`fedhet tune {spec_path}` first"
        )
    data = dict(store.open(STAGE, key).attrs)["tune"]
    selections = [
        Selection(**{**s, "trials": [TrialRecord(**t) for t in s["trials"]]})
        for s in data["selections"]
    ]
    return TuneOutcome(data["key"], data["metric"], data["seeds"], selections)
