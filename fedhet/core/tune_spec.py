"""The `tune:` section of a spec: for each method of the matrix, a search space over its
hyperparameters, a budget of trials (the same for every method unless the spec says otherwise),
the seeds to select on and the selection metric, always on the validation split; optionally how
far a grid is extended past a choice at its edge, and a runoff of close trials on more seeds.

`fedhet.tuning` runs it; this module only says what a valid section is, alone and against the
spec's runs (`tune_problem`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from fedhet.core import registry
from fedhet.core.errors import InputError
from fedhet.core.sections import MAX_SEED, OMIT_IF_DEFAULT, Count, Section

KINDS = ("grid", "choice", "uniform", "log_uniform")
# What a tune may search: the method's hyperparameters. The data, its split, the partition and
# the seeds are the setting the methods are compared in; eval and runtime do not train.
TUNABLE = ("model", "federation", "algorithm")
MAX_TRIALS = 10_000
MAX_EXTENSIONS = 5  # steps a grid may be extended past an edge choice (tune.extend_edges)


class Dimension(Section):
    """One field's values: a grid (every value, each a trial of its own), a choice (values a
    sampler draws from), or a range [low, high] a sampler draws floats from, uniformly or
    log-uniformly."""

    grid: list[Any] | None = Field(None, min_length=1)
    choice: list[Any] | None = Field(None, min_length=1)
    uniform: tuple[float, float] | None = None
    log_uniform: tuple[float, float] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Dimension:
        given = [kind for kind in KINDS if getattr(self, kind) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of grid, choice, uniform or log_uniform, e.g. "
                "{grid: [0.01, 0.1]} or {log_uniform: [0.001, 0.1]}"
            )
        if self.range is not None:
            low, high = self.range
            if not low < high:
                raise ValueError(
                    f"the range [{low}, {high}] is empty; give [low, high], low < high"
                )
            if self.log_uniform is not None and low <= 0:
                raise ValueError(f"a log-uniform range starts above 0, not at {low}")
        return self

    @property
    def kind(self) -> str:
        return next(kind for kind in KINDS if getattr(self, kind) is not None)

    @property
    def range(self) -> tuple[float, float] | None:
        return self.uniform if self.uniform is not None else self.log_uniform

    def probes(self) -> list[Any]:
        """The values to validate: every listed value; a range's ends and a point inside (which
        a field that takes integers refuses)."""
        if self.range is None:
            return list(self.grid if self.grid is not None else self.choice)
        low, high = self.range
        return [low, high, low + 0.37 * (high - low)]

    def describe(self) -> str:
        """As the spec writes it: `grid [0.01, 0.1]`, `log-uniform [0.001, 0.1]`."""
        values = self.range if self.range is not None else getattr(self, self.kind)
        return f"{self.kind.replace('_', '-')} {list(values)}"


Space = dict[str, Dimension]


def _check_paths(space: Space) -> Space:
    for path in space:
        parts = path.split(".")
        if parts[0] not in TUNABLE or len(parts) < 2 or not all(parts):
            raise ValueError(
                f"{path}: a tune searches the fields of {', '.join(TUNABLE)} (e.g. "
                "federation.lr); the data, partition and seeds are the setting it holds fixed"
            )
        if path == "algorithm.name":
            raise ValueError(
                "algorithm.name: the methods are what a tune compares; list them "
                "in the matrix and give each its space under tune.methods"
            )
        if path == "federation.rounds":
            raise ValueError(
                "federation.rounds: the rounds are the training budget every method gets "
                "alike; sweep them in the matrix"
            )
    return space


class MethodTune(Section):
    """What one method (an algorithm name of the matrix) searches beyond the shared space."""

    space: Space = Field(default_factory=dict, description="field path -> its values")
    trials: int | None = Field(
        None,
        ge=1,
        le=MAX_TRIALS,
        description="this method's own budget, unequal to the others' (the report says so)",
    )

    _paths = field_validator("space")(_check_paths)


class PruneSpec(Section):
    """Optuna's MedianPruner on the validation curve: a trial trains to each rung first (a run
    of that many rounds, which the longer run then continues), and stops there when its score
    is below the median of the trials completed, at that rung, before its wave."""

    rungs: list[Count] = Field(
        min_length=1, description="the rounds, increasing, at which a trial may stop"
    )
    startup_trials: int = Field(
        4, ge=0, le=MAX_TRIALS, description="trials completed before any is stopped"
    )

    @field_validator("rungs")
    @classmethod
    def _increasing(cls, rungs: list[int]) -> list[int]:
        if any(b <= a for a, b in zip(rungs, rungs[1:], strict=False)):
            raise ValueError(f"give the rungs in increasing order, not {rungs}")
        return rungs


class RunoffSpec(Section):
    """Close calls settled on more seeds: the trials whose score is within `within` of the best
    one (or within the best one's seed-to-seed standard deviation, when larger), at most
    `candidates` of them, also run `seeds`, and the choice is the highest mean over all their
    seeds."""

    seeds: list[int] = Field(
        min_length=1, description="the runoff's seeds, none of them a selection seed"
    )
    within: float = Field(
        0.01, ge=0, le=1, description="a fraction of accuracy: 0.01 is one point (default)"
    )
    candidates: int = Field(
        2, ge=2, le=MAX_TRIALS, description="at most this many (default 2: best and runner-up)"
    )

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: list[int]) -> list[int]:
        return _distinct(seeds)


class TuneSpec(Section):
    trials: int = Field(ge=1, le=MAX_TRIALS, description="every method's budget of trials")
    seeds: list[int] = Field(
        min_length=1, description="the seeds every trial runs with; its score is their mean"
    )
    metric: Literal["best_val", "final_val"] = Field(
        "best_val",
        description="best_val: the highest validation accuracy of a run; final_val: the last "
        "evaluated round's. Never a test metric",
    )
    sampler: Literal["grid", "random", "tpe"] | None = Field(
        None, description="default: grid when every dimension is a grid, else tpe (Optuna's)"
    )
    sampler_seed: int = Field(0, ge=0, le=MAX_SEED)
    batch: Count = Field(
        4,
        description="with tpe or prune: trials asked together, then told together, so the "
        "search is the same whatever --jobs (otherwise every trial is asked at once)",
    )
    prune: Annotated[PruneSpec | None, OMIT_IF_DEFAULT] = Field(
        None, description="stop bad trials early (default: every trial trains all its rounds)"
    )
    extend_edges: Annotated[int, OMIT_IF_DEFAULT] = Field(
        0,
        ge=0,
        le=MAX_EXTENSIONS,
        description="a grid whose choice is its lowest or highest value gains the next value "
        "past it and is tuned again, at most this many times (default 0: flagged only)",
    )
    runoff: Annotated[RunoffSpec | None, OMIT_IF_DEFAULT] = Field(
        None, description="close trials also run more seeds; the choice is on the mean"
    )
    space: Space = Field(default_factory=dict, description="every method's: field -> values")
    methods: dict[str, MethodTune] = Field(
        default_factory=dict, description="algorithm name -> its own space and budget"
    )

    _paths = field_validator("space")(_check_paths)

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: list[int]) -> list[int]:
        return _distinct(seeds)

    @model_validator(mode="after")
    def _runoff_seeds_are_new(self) -> TuneSpec:
        shared = set(self.runoff.seeds if self.runoff else ()) & set(self.seeds)
        if shared:
            raise ValueError(
                f"runoff.seeds: {sorted(shared)} already a selection seed; a runoff adds seeds"
            )
        return self

    def space_of(self, method: str) -> Space:
        """The method's space: the shared one with the method's own dimensions over it."""
        own = self.methods.get(method, MethodTune()).space
        return {**self.space, **own}

    def budget_of(self, method: str) -> int:
        own = self.methods.get(method, MethodTune()).trials
        return self.trials if own is None else own

    def sampler_of(self, method: str) -> str:
        if self.sampler is not None:
            return self.sampler
        grids = all(d.grid is not None for d in self.space_of(method).values())
        return "grid" if grids else "tpe"

    def unequal_budgets(self) -> dict[str, int]:
        """method -> its own budget, where it differs from `trials`."""
        return {m: t.trials for m, t in self.methods.items() if t.trials not in (None, self.trials)}


def _distinct(seeds: list[int]) -> list[int]:
    if len(set(seeds)) != len(seeds) or not all(0 <= s <= MAX_SEED for s in seeds):
        raise ValueError("give distinct seeds, each at least 0")
    return seeds


# --- against the spec's runs -------------------------------------------------------------

Problem = tuple[tuple[str, ...], str, Any]  # (location, message, value): fedhet.core.spec.located
Parse = Callable[[dict[str, Any], str], Any]  # fedhet.core.spec.parse_run


def with_values(run: Any, values: dict[str, Any], parse: Parse, source: str) -> Any:
    """The run spec `run` with each dotted field set to its value, validated by `parse`: the
    spec of an ordinary run (no matrix, no tune), so its keys are that run's."""
    data = run.model_dump(mode="json", exclude={"matrix", "tune"}, serialize_as_any=True)
    for path, value in values.items():
        *parents, leaf = path.split(".")
        node = data
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            raise InputError(f"{source}: {path} names no field of the spec; fix the path")
        node[leaf] = value
    return parse(data, source)


def tune_problem(tune: TuneSpec, runs: list[Any], axes: list[str], parse: Parse) -> Problem | None:
    """The first reason the tune cannot run over these runs (a spec's, its matrix `axes`): no
    validation split, a method or path that matches nothing, a field the matrix sweeps, unequal
    budgets the spec did not ask for, a value no run takes. None when it can."""
    if any(run.data.validation is None for run in runs):
        return (
            ("data", "validation"),
            "a tune selects on the validation split, never the test split; set "
            "data.validation, e.g. 0.2",
            None,
        )
    methods = list(dict.fromkeys(run.algorithm.name for run in runs))
    return (
        _rungs_past_the_end(tune, runs)
        or _unknown_method(tune, methods)
        or _swept_path(tune, methods, axes)
        or next(filter(None, (_budget_problem(tune, m) for m in methods)), None)
        or _invalid_value(tune, runs, parse)
    )


def _where(tune: TuneSpec, method: str, path: str) -> tuple[str, ...]:
    own = method in tune.methods and path in tune.methods[method].space
    return ("tune", "methods", method, "space", path) if own else ("tune", "space", path)


def _rungs_past_the_end(tune: TuneSpec, runs: list[Any]) -> Problem | None:
    rounds = min(run.federation.rounds for run in runs)
    if tune.prune is None or tune.prune.rungs[-1] < rounds:
        return None
    message = f"a rung is a round before the last ({rounds}); give rungs below it"
    return ("tune", "prune", "rungs"), message, tune.prune.rungs


def _unknown_method(tune: TuneSpec, methods: list[str]) -> Problem | None:
    """A name that is no algorithm (one that only the runs left out by `--only` use is fine)."""
    known = registry.configs()
    for name in tune.methods:
        if name not in known:
            message = f"no such algorithm; name one of the spec's: {', '.join(methods)}"
            return ("tune", "methods", name), message, name
    return None


def _swept_path(tune: TuneSpec, methods: list[str], axes: list[str]) -> Problem | None:
    for method in methods:
        for path in tune.space_of(method):
            for axis in axes:
                if path == axis or axis.startswith(f"{path}."):
                    message = (
                        f"the matrix sweeps {axis}; tune it or sweep it, not both (drop the "
                        "axis, or the field from the space)"
                    )
                    return _where(tune, method, path), message, path
    return None


def _budget_problem(tune: TuneSpec, method: str) -> Problem | None:
    space, budget = tune.space_of(method), tune.budget_of(method)
    own = tune.methods.get(method, MethodTune()).trials is not None
    where = ("tune", "methods", method, "trials") if own else ("tune", "trials")
    if not space:
        message = (
            f"nothing to tune for {method}; give it a space (tune.space for every method, "
            f"tune.methods.{method}.space for its own)"
        )
        return ("tune", "methods", method), message, method
    sampler = tune.sampler_of(method)
    grids = [path for path, d in space.items() if d.grid is not None]
    if sampler != "grid" and grids:
        message = f"a grid is every value, for the grid sampler; with {sampler}, use choice"
        return _where(tune, method, grids[0]), message, space[grids[0]].model_dump()
    if sampler == "grid" and len(grids) < len(space):
        path = next(p for p in space if p not in grids)
        message = "the grid sampler takes grids only; make it a grid, or choose another sampler"
        return _where(tune, method, path), message, space[path].model_dump()
    points = math.prod(len(space[path].grid or []) for path in grids)
    if sampler == "grid" and points != budget:
        message = (
            f"{method}'s grid has {points} points for a budget of {budget} trials; every method "
            f"gets the same budget: make its grid {budget} points, or give {method} its own "
            f"(tune.methods.{method}.trials: {points}, an unequal budget the report states)"
        )
        return where, message, budget
    return None


def _invalid_value(tune: TuneSpec, runs: list[Any], parse: Parse) -> Problem | None:
    first = {}  # a run per method and setting is enough: the seeds change no validity
    for run in runs:
        first.setdefault(run.model_dump_json(exclude={"seed"}), run)
    for run in first.values():
        method = run.algorithm.name
        for path, dimension in tune.space_of(method).items():
            for value in dimension.probes():
                try:
                    with_values(run, {path: value}, parse, f"{method} run")
                except InputError as error:
                    message = f"{value!r} gives an invalid {error}"
                    return _where(tune, method, path), message, dimension.model_dump()
    return None
