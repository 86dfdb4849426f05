"""What the store holds of a spec: each stage's state (stored, partial: round k of n, diverged,
blocked by a diverged stage, missing), each run's results so far, and the time the missing work
should take, estimated from stored artifacts of the same stage and shape."""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedhet.core import divergence
from fedhet.core.pipeline import StageNode
from fedhet.core.spec import Spec
from fedhet.core.store import ArtifactInfo, ArtifactStore
from fedhet.execution.planning import Run
from fedhet.execution.results import result_row, stored_divergence, stored_metrics

if TYPE_CHECKING:
    from fedhet.engine.extension import Extension

STORED, PARTIAL, MISSING, DIVERGED = "stored", "partial", "missing", "diverged"
DAMAGED = "damaged"  # stored, but its checksums (those `fedhet plan` checks) find it corrupt
BLOCKED = "blocked"  # missing, built on a stage that diverged: it never runs (TCT's stage 2)
DONE = (STORED, DIVERGED, BLOCKED)  # a diverged stage is a result too: nothing left to run
# The federation fields that set how much work a round is.
_FEDERATION_SIZES = ("clients_per_round", "fraction", "local_epochs", "local_steps", "batch_size")


@dataclass(frozen=True)
class StageState:
    node: StageNode
    state: str
    done: int | None = None  # rounds completed: a partial stage's checkpoint, the run it
    # extends, or the round a diverged stage diverged in
    total: int | None = None  # the stage's rounds, for stages that run in rounds
    extends: Extension | None = None  # the stored shorter run a missing train stage continues
    damage: str | None = None  # what a damaged stage's checksums find, in one line

    @property
    def description(self) -> str:
        if self.damage is not None:
            return f"{DAMAGED}: {self.damage}"
        if self.state == PARTIAL and self.done is not None:
            return f"partial (round {self.done} of {self.total or '?'})"
        if self.extends is not None:
            return f"{self.state} ({self.extends.describe()})"
        if self.state == DIVERGED:
            return f"diverged (in round {self.done} of {self.total or '?'})"
        if self.state == BLOCKED:
            return "blocked (a stage it is built on diverged)"
        return self.state


def _rounds(config: dict[str, Any]) -> int | None:
    federation = config.get("federation")
    return federation.get("rounds") if isinstance(federation, dict) else None


def stage_state(
    node: StageNode, store: ArtifactStore, spec: Spec, verify: bool = False
) -> StageState:
    """The state of `node` (of a run of `spec`) in `store`; with `verify`, a stored one is
    damaged when its checksums say so (see `damage`)."""
    total = _rounds(node.config)
    if store.exists(node.stage, node.key):
        found = damage(node.stage, node.key, store) if verify else None
        if found is not None:
            return StageState(node, DAMAGED, None, total, damage=found)
        return StageState(node, STORED, total, total)
    # imported here: they import zarr (0.15 s), which a stored stage's state does without
    from fedhet.engine.extension import stored_prefix
    from fedhet.engine.run_format import Checkpoints

    partial = store.partial_dir(node.stage, node.key)
    if not partial.exists():
        extends = stored_prefix(node, node.spec or spec, store)
        done = None if extends is None else extends.rounds
        return StageState(node, MISSING, done, total, extends)
    diverged = divergence.recorded(partial)
    if diverged is not None:
        return StageState(node, DIVERGED, diverged.round_number, total)
    done = Checkpoints(partial).latest_round()
    return StageState(node, PARTIAL, done, total)


# --- time estimates ---------------------------------------------------------------------


def _shape(stage: str, config: dict[str, Any], upstream: list[Any]) -> str:
    """What a stage's duration depends on, with its upstream shapes: for a partition its dataset
    and number of clients; for a training its model, algorithm and the federation's sizes (not
    its rounds, learning rates or seed); for other stages their config less seed and rounds."""
    if stage == "partition":
        config = {"dataset": config.get("dataset"), "clients": config["partition"].get("clients")}
    elif {"model", "federation", "algorithm"} <= set(config):
        federation = {k: v for k, v in config["federation"].items() if k in _FEDERATION_SIZES}
        config = {
            "model": config["model"],
            "algorithm": config["algorithm"].get("name"),
            "federation": federation,
        }
    else:
        config = {k: v for k, v in config.items() if k not in ("seed", "rounds")}
    return json.dumps([stage, config, sorted(upstream)], sort_keys=True)


def node_shape(node: StageNode) -> str:
    return _shape(node.stage, node.config, [node_shape(up) for up in node.upstream.values()])


class Estimator:
    """Seconds a stage still needs, from the stored artifacts of the same stage and shape: their
    median seconds per round times the rounds left, or their median wall time for stages without
    rounds (a median, so that one run whose process was stopped for a while leaves it)."""

    def __init__(self, store: ArtifactStore):
        by_key = {info.key: info for info in store.ls()}
        self._per_shape: dict[str, list[float]] = defaultdict(list)
        for info in by_key.values():
            shape, seconds = self._shape_of(info, by_key), info.attrs.get("wall_time_s")
            rounds = _rounds(info.attrs.get("config", {}))
            if shape is not None and isinstance(seconds, int | float):
                self._per_shape[shape].append(seconds / rounds if rounds else seconds)

    def _shape_of(self, info: ArtifactInfo, by_key: dict[str, ArtifactInfo]) -> str | None:
        upstream = []
        for key in info.attrs.get("upstream", {}).values():
            if key not in by_key:
                return None
            upstream.append(self._shape_of(by_key[key], by_key))
        if "config" not in info.attrs or None in upstream:
            return None
        return _shape(info.stage, info.attrs["config"], upstream)

    def seconds_left(self, state: StageState) -> float | None:
        """None when no stored artifact gives an estimate; 0 for a stored stage."""
        if state.state in DONE:
            return 0.0
        samples = self._per_shape.get(node_shape(state.node))
        if not samples:
            return None
        per_unit = statistics.median(samples)
        if state.total is None:
            return per_unit
        return per_unit * (state.total - (state.done or 0))


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "no estimate"
    if seconds < 1:
        return "<1s"
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes = round(seconds / 60)
    return f"{minutes}m" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


# --- the plan and the runs --------------------------------------------------------------


# told of each damaged stored artifact a plan finds: its stage, key and damage (see `damage`)
OnDamage = Callable[[str, str, str], None]


def damage(stage: str, key: str, store: ArtifactStore) -> str | None:
    """What `fedhet artifacts verify` finds wrong with the stored artifact, in one line; None
    when intact. Its checksums are recomputed without decoding its arrays (each chunk's crc32c
    on its bytes: see `member_problems`): a plan of 20 stored digits runs takes 0.25 s of CPU
    (0.04 s unchecked; 1.6 s decoding every array)."""
    return "; ".join(store.verify(stage, key, decode=False)) or None


def plan_rows(
    runs: list[Run], store: ArtifactStore, on_damage: OnDamage
) -> tuple[list[dict[str, Any]], str]:
    """One row per stage of every run, a stage shared by several runs only under the first; and
    a one-line summary of the states and the time still needed. A stored stage's checksums are
    checked (`damage`): a damaged one is told to `on_damage` too."""
    users: dict[str, int] = defaultdict(int)
    for run in runs:
        for node in run.node.walk():
            users[node.key] += 1
    estimator, rows, states = Estimator(store), [], {}
    for run in runs:
        for node in run.node.walk():  # upstream first
            if node.key in states:
                continue
            state = stage_state(node, store, run.spec, verify=True)
            ended = [states[up.key].state in (DIVERGED, BLOCKED) for up in node.upstream.values()]
            if state.state == MISSING and any(ended):
                state = StageState(node, BLOCKED, total=state.total)
            states[node.key] = state
            if state.damage is not None:
                on_damage(node.stage, node.key, state.damage)
            left = estimator.seconds_left(state)
            rows.append(
                {
                    "run": run.label,
                    "stage": node.stage,
                    "key": node.key[:10],
                    "state": state.description,
                    "runs": users[node.key],
                    "seconds_left": left,
                    "left": "" if state.state in DONE else duration(left),
                }
            )
    return rows, summary(rows)


def outcome_row(
    label: str, stage: str, key: str, store: ArtifactStore, on_damage: OnDamage
) -> dict[str, Any]:
    """The plan's row of an artifact computed from the runs' results, not from a run of its own
    (a tune's outcome): stored, missing, or damaged (told to `on_damage` too)."""
    stored = store.exists(stage, key)
    found = damage(stage, key, store) if stored else None
    if found is not None:
        on_damage(stage, key, found)
    state = f"{DAMAGED}: {found}" if found else STORED if stored else MISSING
    return {
        "run": label,
        "stage": stage,
        "key": key[:10],
        "state": state,
        "runs": 1,
        "seconds_left": None,
        "left": "" if state == STORED else duration(None),
    }


def summary(rows: list[dict[str, Any]]) -> str:
    """The plan's states in one line, and the time still needed (see `time_needed`)."""
    counts = defaultdict(int)
    for row in rows:
        counts[row["state"].split()[0].rstrip(":")] += 1
    states = ", ".join(
        f"{counts[s]} {s}"
        for s in (STORED, DIVERGED, BLOCKED, PARTIAL, MISSING, DAMAGED)
        if counts[s]
    )
    if counts[PARTIAL] + counts[MISSING] + counts[DAMAGED] == 0:
        return f"{len(rows)} stages: {states}; nothing left to run"
    return f"{len(rows)} stages: {states}; {time_needed(rows)}"


def time_needed(rows: list[dict[str, Any]]) -> str:
    """The time the stages left to run need, saying which stages it covers when some have no
    estimate: "about 8s for 15 partition stages; no estimate for 200 train stages (...)", not
    a total that reads as the whole plan's."""
    left = [row for row in rows if row["left"]]  # a stage to run has its `left` cell
    known = [row for row in left if row["seconds_left"] is not None]
    unknown = [row for row in left if row["seconds_left"] is None]
    total = f"about {duration(sum(row['seconds_left'] for row in known))}"
    if not unknown:
        return f"{total} still needed"
    if not known:
        return "no time estimate"
    return (
        f"{total} for {_stages(known)}; no estimate for {_stages(unknown)} "
        "(nothing stored of their shape to time them by)"
    )


def _stages(rows: list[dict[str, Any]]) -> str:
    """The number of rows of each stage: "15 partition and 200 train stages"."""
    counts = Counter(row["stage"] for row in rows)
    named = [f"{n} {stage}" for stage, n in counts.items()]
    listed = named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"
    return f"{listed} stage{'s' if len(rows) > 1 else ''}"


_RESULTS = ("best_test", "test_at_best_val", "final", "wall_time_s")


def run_state(run: Run, store: ArtifactStore) -> StageState:
    """The state of the run's own stage, checksums checked; a run whose own stage is missing
    because a stage it is built on diverged (TCT's stage 1) is diverged, in that round. A
    diverged run's rounds are the whole run's (TCT: both stages')."""
    state = stage_state(run.node, store, run.spec, verify=True)
    if state.state not in (MISSING, DIVERGED):
        return state
    diverged = stored_divergence(run, store)
    if diverged is None:
        return state
    return StageState(run.node, DIVERGED, diverged.round_number, run.spec.federation.rounds)


def run_row(run: Run, store: ArtifactStore, on_damage: OnDamage) -> dict[str, Any]:
    """A run's results as far as the store has them. A stored run's checksums are checked as
    the plan checks them (`damage`): a damaged one has no results and is told to `on_damage`."""
    state = run_state(run, store)
    if state.damage is not None:
        on_damage(run.node.stage, run.node.key, state.damage)
    row: dict[str, Any] = {
        "label": run.label,
        "algorithm": run.algorithm_label,
        "setting": run.setting_label,
        "seed": run.spec.seed,
        "state": state.state,
        "best_test": math.nan,
        "test_at_best_val": math.nan,
        "final": math.nan,
        "rounds": f"{state.done or 0}/{state.total}" if state.total and not state.damage else "",
        "wall_time_s": math.nan,
    }
    if state.state == STORED:
        group = store.open(run.node.stage, run.node.key)
        if "metrics" in group:
            result = result_row(run, stored_metrics(group))
            row |= {k: result[k] for k in _RESULTS if k in result}
            row["rounds"] = result["rounds"]
    if state.state == DIVERGED:  # the rounds before: no final accuracy
        before = result_row(run, stored_divergence(run, store).metrics)
        row |= {
            k: before[k] for k in ("best_test", "test_at_best_val", "wall_time_s") if k in before
        }
        row["rounds"] = f"{state.done}/{state.total}"
    return row
