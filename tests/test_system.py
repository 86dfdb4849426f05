"""System heterogeneity (`federation.system`): the section keeps today's keys when absent or
default; its draws are deterministic per (seed, round, client) whoever else is in the round,
stay in their ranges, drop clients at the stated rate, and apply the deadline by definition."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from conftest import TINY_SPEC, CliRunner, write_spec
from scipy.stats import binom

from fedhet.core.errors import InputError
from fedhet.core.spec import FederationSpec, parse_spec
from fedhet.engine.loop import sample_holders
from fedhet.engine.system import (
    DEADLINE,
    DROPOUT,
    available,
    local_steps,
    num_local_steps,
    plan_round,
    steps_for_epochs,
)
from fedhet.execution.planning import runs_of

SEED = 7
SIZES = [0, 40, 75, 128, 33, 300, 64, 90, 12, 57]  # client 0 holds nothing
HOLDERS = [c for c, n in enumerate(SIZES) if n > 0]


def federation(system: dict[str, Any] | None = None, **fields: Any) -> FederationSpec:
    return FederationSpec.model_validate({"batch_size": 16, **fields, "system": system})


def plan(fed: FederationSpec, rnd: int, holders: list[int] = HOLDERS, per_round: int = 5):
    return plan_round(fed, SEED, rnd, SIZES, holders, per_round, sample_holders)


# --- the spec section and keys ------------------------------------------------------------


def keys_of(federation_section: dict[str, Any]) -> dict[str, str]:
    spec = parse_spec({**TINY_SPEC, "federation": federation_section})
    (run,) = runs_of(spec)
    return {node.stage: node.key for node in run.node.walk()}


BASE_FEDERATION = TINY_SPEC["federation"]
DEFAULT_SYSTEMS = [
    {},
    {"availability": 1.0, "dropout": 0.0, "speed": 1.0, "redraw": "round"},
    {"stragglers": "partial", "deadline": None, "local_epochs": None},
]


@pytest.mark.parametrize("system", DEFAULT_SYSTEMS)
def test_a_default_system_section_keys_as_no_section(system: dict[str, Any]):
    spec = parse_spec({**TINY_SPEC, "federation": {**BASE_FEDERATION, "system": system}})
    assert spec.federation.system is None
    assert "system" not in spec.federation.model_dump(mode="json")
    assert keys_of({**BASE_FEDERATION, "system": system}) == keys_of(BASE_FEDERATION)


@pytest.mark.parametrize(
    "system",
    [
        {"local_epochs": {"low": 2, "high": 5}},
        {"local_epochs": {"low": 2, "high": 5}, "redraw": "fixed"},
        {"availability": 0.8},
        {"dropout": 0.1},
        {"deadline": 2},
        {"deadline": 2, "stragglers": "drop"},
    ],
)
def test_a_set_option_changes_the_train_key_only(system: dict[str, Any]):
    plain, varied = keys_of(BASE_FEDERATION), keys_of({**BASE_FEDERATION, "system": system})
    assert varied["partition"] == plain["partition"]
    assert varied["train"] != plain["train"]


def test_a_set_section_parses_back_to_itself():
    spec = parse_spec({"federation": {"system": {"local_steps": [5, 10], "deadline": 8}}})
    assert parse_spec(spec.model_dump(mode="json")) == spec


BAD_SYSTEMS = [
    ({"local_epochs": "two"}, "federation.system.local_epochs: ", "{low, high} or a list"),
    ({"local_epochs": {"low": 5, "high": 2}}, "federation.system.local_epochs: ", "swap"),
    ({"local_steps": {"low": 0, "high": 2}}, "federation.system.local_steps: low: ", ">= 1"),
    ({"local_steps": []}, "federation.system.local_steps: ", "at least 1"),
    ({"availability": 0}, "federation.system.availability: ", "greater than 0"),
    ({"availability": {"low": 0.5, "high": 1.5}}, "availability: high: ", "less than or"),
    ({"dropout": 1.0}, "federation.system.dropout: ", "less than 1"),
    ({"local_epochs": 2, "local_steps": 3}, "federation.system: ", "not both"),
    ({"redraw": "fixed"}, "federation.system: ", "set one"),
    ({"stragglers": "drop"}, "federation.system: ", "set deadline"),
    ({"speed": {"low": 0.5, "high": 1.0}}, "federation.system: ", "set deadline"),
    ({"deadline": -1}, "federation.system.deadline: ", "greater than 0"),
    ({"late": "drop"}, "federation.system.late: ", "unknown field"),
]


@pytest.mark.parametrize(("system", "where", "what"), BAD_SYSTEMS)
def test_bad_settings_are_refused_in_one_line_naming_the_field(system, where, what):
    with pytest.raises(InputError) as caught:
        parse_spec({"federation": {"system": system}})
    message = str(caught.value).replace("greater than or equal to", ">=")
    assert "\n" not in message and where in message and what in message


def test_local_work_is_set_in_one_place():
    with pytest.raises(InputError, match="federation: system.local_epochs/local_steps replace"):
        parse_spec({"federation": {"local_steps": 5, "system": {"local_epochs": [1, 2]}}})
    parse_spec({"federation": {"local_steps": 5, "system": {"dropout": 0.5}}})


def test_the_cli_refuses_a_bad_section_with_exit_2_and_one_line(fedhet: CliRunner, tmp_path):
    bad = {**TINY_SPEC, "federation": {**BASE_FEDERATION, "system": {"dropout": 2}}}
    result = fedhet("spec", "validate", write_spec(tmp_path / "bad.yaml", bad))
    assert result.rc == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "federation.system.dropout" in lines[0]
    assert "Traceback" not in result.stderr


# --- the draws ----------------------------------------------------------------------------


def test_without_the_section_every_round_is_todays():
    for fed in [federation(), federation(local_steps=7), federation(local_epochs=2.5)]:
        for rnd in range(10):
            p = plan(fed, rnd)
            assert list(p.sampled) == sample_holders(SEED, rnd, HOLDERS, 5)
            assert p.reported == list(p.sampled) and not p.dropped
            assert p.steps == {c: num_local_steps(fed, SIZES[c]) for c in p.sampled}


def test_steps_for_epochs_is_num_local_steps():
    for n in SIZES[1:]:
        for epochs in [0.3, 1, 2.5, 4]:
            assert steps_for_epochs(epochs, n, 16) == num_local_steps(
                federation(local_epochs=epochs), n
            )


HETEROGENEOUS = {
    "local_epochs": {"low": 2, "high": 5},
    "availability": {"low": 0.3, "high": 0.9},
    "dropout": 0.2,
    "speed": [0.5, 1.0, 2.0],
    "deadline": 3,
}


@pytest.mark.parametrize("stragglers", ["partial", "drop"])
def test_a_clients_draws_do_not_depend_on_who_else_is_in_the_round(stragglers: str):
    fed = federation({**HETEROGENEOUS, "stragglers": stragglers})
    for rnd in range(20):
        everyone = plan(fed, rnd, per_round=len(HOLDERS))
        assert plan(fed, rnd, per_round=len(HOLDERS)) == everyone  # the same spec, same draws
        fewer = plan(fed, rnd, holders=HOLDERS[::-1][:6], per_round=3)
        assert set(fewer.sampled) <= set(everyone.sampled)  # availability is per client
        for c in fewer.sampled:
            assert fewer.steps.get(c) == everyone.steps.get(c)
            assert fewer.dropped.get(c) == everyone.dropped.get(c)


def test_work_is_redrawn_per_round_and_client_or_fixed_per_client():
    per_round = federation({"local_steps": {"low": 1, "high": 50}})
    fixed = federation({"local_steps": {"low": 1, "high": 50}, "redraw": "fixed"})
    by_round = {
        c: [local_steps(per_round, SEED, r, c, SIZES[c]) for r in range(20)] for c in HOLDERS
    }
    assert all(len(set(draws)) > 1 for draws in by_round.values())  # changes with the round
    assert len({tuple(draws) for draws in by_round.values()}) == len(HOLDERS)  # and the client
    by_client = {c: {local_steps(fixed, SEED, r, c, SIZES[c]) for r in range(20)} for c in HOLDERS}
    assert all(len(draws) == 1 for draws in by_client.values())
    assert len({d.pop() for d in by_client.values()}) > 1
    other_seed = [local_steps(per_round, SEED + 1, r, 1, SIZES[1]) for r in range(20)]
    assert other_seed != by_round[1]


def test_drawn_work_stays_in_its_range_and_covers_it():
    epochs = federation({"local_epochs": {"low": 2, "high": 5}})
    for c in HOLDERS:
        allowed = {steps_for_epochs(e, SIZES[c], 16) for e in range(2, 6)}
        drawn = {local_steps(epochs, SEED, r, c, SIZES[c]) for r in range(200)}
        assert drawn == allowed
    choices = federation({"local_steps": [3, 8, 21]})
    assert {local_steps(choices, SEED, r, 4, SIZES[4]) for r in range(200)} == {3, 8, 21}
    constant = federation({"local_epochs": 1.5})
    assert local_steps(constant, SEED, 0, 5, 300) == num_local_steps(
        federation(local_epochs=1.5), 300
    )


def within_binomial(count: int, trials: int, p: float) -> bool:
    low, high = binom.interval(1 - 1e-6, trials, p)
    return low <= count <= high


def test_dropout_rate_is_right_over_many_draws():
    fed = federation({"dropout": 0.3})
    plans = [plan(fed, rnd, per_round=len(HOLDERS)) for rnd in range(1500)]
    dropped = sum(len(p.dropped) for p in plans)
    assert within_binomial(dropped, 1500 * len(HOLDERS), 0.3)
    assert {r for p in plans for r in p.dropped.values()} == {DROPOUT}
    for p in plans:  # the reporters and the dropped split the sampled clients
        assert sorted([*p.reported, *p.dropped]) == sorted(p.sampled)
        assert set(p.steps) == set(p.reported)


def test_availability_bounds_sampling():
    fed = federation({"availability": 0.5})
    counts = 0
    for rnd in range(600):
        up = available(fed, SEED, rnd, HOLDERS)
        counts += len(up)
        p = plan(fed, rnd, per_round=4)
        assert set(p.sampled) <= set(up)
        assert len(p.sampled) == min(4, len(up))  # all available when fewer than per round
    assert within_binomial(counts, 600 * len(HOLDERS), 0.5)


def test_per_client_availability_is_each_clients_own():
    fed = federation({"availability": {"low": 0.05, "high": 0.95}})
    rates = np.zeros(len(SIZES))
    for rnd in range(400):
        rates[available(fed, SEED, rnd, HOLDERS)] += 1 / 400
    assert rates[0] == 0  # never a client without samples
    assert rates[HOLDERS].max() - rates[HOLDERS].min() > 0.3


def test_a_round_with_nobody_available_reports_nothing():
    fed = federation({"availability": 0.01})
    empty = next(p for p in (plan(fed, r) for r in range(100)) if not p.sampled)
    assert empty.reported == [] and empty.steps == {}
    metrics = empty.metrics()
    assert metrics["clients_sampled"] == metrics["clients_reported"] == 0
    assert math.isnan(metrics["mean_local_steps"])


SPEEDS = [0.25, 0.5, 1.0, 3.0]


def test_partial_stragglers_report_floor_of_speed_times_deadline_capped_by_their_work():
    fed = federation({"local_steps": 6, "speed": SPEEDS, "deadline": 4})
    seen = set()
    for rnd in range(30):
        p = plan(fed, rnd, per_round=len(HOLDERS))
        assert not p.dropped
        seen |= set(p.steps.values())
    assert seen == {min(6, math.floor(s * 4)) for s in SPEEDS}  # 1, 2, 4, 6


def test_partial_stragglers_count_the_deadline_in_epochs_of_their_own_data():
    fed = federation({"local_epochs": 3, "deadline": 2})  # speed 1: 2 of the 3 epochs
    p = plan(fed, 0, per_round=len(HOLDERS))
    assert p.steps == {c: 2 * math.ceil(SIZES[c] / 16) for c in HOLDERS}


def test_a_client_with_no_step_done_by_the_deadline_is_dropped():
    fed = federation({"local_steps": 5, "speed": 0.1, "deadline": 3})
    p = plan(fed, 0, per_round=len(HOLDERS))
    assert p.dropped == {c: DEADLINE for c in HOLDERS}


def test_drop_mode_drops_exactly_the_clients_past_the_deadline():
    system = {"local_epochs": {"low": 1, "high": 4}, "speed": SPEEDS, "deadline": 2}
    partial, drop = federation(system), federation({**system, "stragglers": "drop"})
    for rnd in range(30):
        lenient, strict = plan(partial, rnd), plan(drop, rnd)
        assert lenient.sampled == strict.sampled
        full = {c: local_steps(partial, SEED, rnd, c, SIZES[c]) for c in strict.sampled}
        late = {c for c in lenient.sampled if c in lenient.dropped or lenient.steps[c] < full[c]}
        assert strict.dropped == {c: DEADLINE for c in late}
        assert strict.steps == {c: full[c] for c in strict.reported}


def test_round_metrics_count_the_plan():
    fed = federation({"local_steps": [2, 4], "dropout": 0.5})
    p = next(p for p in (plan(fed, r) for r in range(50)) if p.dropped and p.reported)
    assert p.metrics() == {
        "clients_sampled": 5.0,
        "clients_reported": float(len(p.reported)),
        "clients_dropped": float(len(p.dropped)),
        "mean_local_steps": float(np.mean([p.steps[c] for c in p.reported])),
    }
