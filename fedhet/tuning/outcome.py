"""A tune's outcome, an artifact of the store (`tune/<key>.zarr`, all in its attributes): for each
method and setting its space, sampler and budget, every trial's values, run keys and validation
scores (and a runoff's), the chosen trial, the values added past an edge, and the edges the
choice still lies at. Its key hashes the tune section and the groups' keys: what decides every
trial (the trials' own runs are stored under theirs, its `upstream`)."""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from fedhet.core.errors import InputError, RunError
from fedhet.core.keys import stage_key
from fedhet.core.spec import Spec
from fedhet.core.store import ArtifactStore
from fedhet.core.tune_spec import TuneSpec
from fedhet.tuning.choice import Choice
from fedhet.tuning.edges import Edge, edges_of, kind_of
from fedhet.tuning.groups import TuneGroup
from fedhet.tuning.selection import trial_score

STAGE, VERSION = "tune", 1


@dataclass(frozen=True)
class TrialRecord:
    number: int
    values: dict[str, Any]
    keys: list[str]  # its runs' keys, one per selection seed (a pruned trial's: at its rung)
    scores: list[float | None]  # theirs; None: the run diverged or was never evaluated
    pruned_at: int | None = None  # the rung (round) the pruner stopped it at
    runoff_keys: list[str] = field(default_factory=list)  # its runs on the runoff's seeds
    runoff_scores: list[float | None] = field(default_factory=list)

    @property
    def score(self) -> float:
        return trial_score([math.nan if s is None else s for s in self.scores])

    @property
    def runoff_score(self) -> float:
        """The mean over the selection and the runoff seeds; NaN when it ran no runoff."""
        if not self.runoff_keys:
            return math.nan
        scores = [*self.scores, *self.runoff_scores]
        return trial_score([math.nan if s is None else s for s in scores])

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
    extended: dict[str, list[Any]] = field(default_factory=dict)  # field -> values added
    edges: list[Edge] = field(default_factory=list)  # where the choice lies at an edge

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
    runoff_seeds: list[int] = field(default_factory=list)


def _config(tune: TuneSpec, group_keys: list[str]) -> dict[str, Any]:
    config = {"tune": tune.model_dump(mode="json"), "groups": group_keys}
    if tune.runoff is not None and tune.extend_edges:
        # since 1487782 a runoff's choice at an edge extends its grid: only these tunes recompute
        config["runoff_extends"] = True
    return config


def tune_key(tune: TuneSpec, groups: list[TuneGroup]) -> str:
    return stage_key(STAGE, VERSION, _config(tune, [g.key for g in groups]), {})


def outcome_of(key: str, tune: TuneSpec, choices: list[Choice]) -> TuneOutcome:
    """The outcome of complete choices; RunError when every trial of a group diverged."""
    selections = []
    for choice in choices:
        group = choice.group
        if choice.chosen is None:
            raise RunError(
                f"tune: no trial of {group.algorithm_label} ({group.setting_label}) ran all its "
                "rounds without diverging; narrow its space (e.g. smaller learning rates)"
            )
        records = [
            TrialRecord(
                t.number,
                t.values,
                [run.node.key for run in t.latest],
                _scores(t.scores),
                t.pruned_at,
                [run.node.key for run in t.runoff],
                _scores(t.runoff_scores),
            )
            for t in choice.trials
        ]
        space = {path: d.describe() for path, d in group.space.items()}
        edges = [
            dataclasses.replace(edge, stop=choice.stops.get((edge.path, edge.side)))
            for edge in _edges(space, records, choice.chosen)
        ]
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
                choice.chosen,
                choice.added,
                edges,
            )
        )
    runoff_seeds = list(tune.runoff.seeds) if tune.runoff else []
    return TuneOutcome(key, tune.metric, list(tune.seeds), selections, runoff_seeds)


def _scores(scores: list[float]) -> list[float | None]:
    return [None if math.isnan(s) else s for s in scores]


def _edges(space: dict[str, str], trials: list[TrialRecord], chosen: int) -> list[Edge]:
    kinds = {path: kind_of(description) for path, description in space.items()}
    return edges_of(kinds, [t.values for t in trials], trials[chosen].values)


def write_outcome(store: ArtifactStore, outcome: TuneOutcome, spec: Spec, tune: TuneSpec) -> None:
    import optuna

    upstream = {
        f"{s.algorithm}, {s.setting}, trial {t.number}, seed {seed}": key
        for s in outcome.selections
        for t in s.trials
        for seed, key in zip(outcome.seeds, t.keys, strict=True)
    }
    upstream |= {
        f"{s.algorithm}, {s.setting}, trial {t.number}, runoff seed {seed}": key
        for s in outcome.selections
        for t in s.trials
        if t.runoff_keys
        for seed, key in zip(outcome.runoff_seeds, t.runoff_keys, strict=True)
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


def read_outcome(
    store: ArtifactStore, key: str, spec_path: str, remedy: str | None = None
) -> TuneOutcome:
    """The stored outcome; InputError naming how to compute it (`remedy`, by default the
    command) when there is none."""
    if not store.exists(STAGE, key):
        remedy = remedy or f"run `fedhet tune {spec_path}` first"
        raise InputError(f"the tune of {spec_path} is not stored (tune {key[:12]}); {remedy}")
    data = dict(store.open(STAGE, key).attrs)["tune"]
    selections = [_selection(s) for s in data["selections"]]
    return TuneOutcome(
        data["key"], data["metric"], data["seeds"], selections, data.get("runoff_seeds", [])
    )


def _selection(data: dict[str, Any]) -> Selection:
    """A stored selection; its edges found from its trials where it predates them."""
    trials = [TrialRecord(**t) for t in data["trials"]]
    if "edges" in data:
        edges = [Edge(**edge) for edge in data["edges"]]
    else:
        edges = _edges(data["space"], trials, data["chosen"])
    return Selection(**{**data, "trials": trials, "edges": edges})
