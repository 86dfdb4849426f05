"""System heterogeneity's draws for one round (`federation.system`): which clients are available
and sampled, how many local steps each does, and which drop out or miss the deadline.

Every draw has its own generator, seeded by (spec seed, purpose, round, client) or, for a
client's fixed properties, (spec seed, purpose, client): a client's draw never depends on who
else is in the round, on their order, or on the executor. Without the section every draw is
today's: all holders available, `sample` among them, federation's local work, nobody dropped.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedhet.core.rng import numpy_rng
from fedhet.core.spec import FederationSpec
from fedhet.core.system_spec import IntRange, Range, SystemSpec

# (seed, round, candidates, per_round) -> the sampled clients (the engine's `sample_holders`)
Sampler = Callable[[int, int, list[int], int], list[int]]

DROPOUT = "dropout"  # dropped out before reporting
DEADLINE = "deadline"  # late at the deadline (`stragglers: drop`), or no step done by then

# The per-round metrics a run with a system section records besides the engine's own
METRICS = ("clients_sampled", "clients_reported", "clients_dropped", "mean_local_steps")


@dataclass(frozen=True)
class RoundPlan:
    """What the round's clients do: the engine trains `reported` for `steps[c]` steps each and
    aggregates them alone; the `dropped` clients (client -> reason) train and report nothing."""

    sampled: tuple[int, ...]
    steps: dict[int, int]  # each reporting client's local steps this round
    dropped: dict[int, str]

    @property
    def reported(self) -> list[int]:
        return [c for c in self.sampled if c not in self.dropped]

    def metrics(self) -> dict[str, float]:
        steps = [self.steps[c] for c in self.reported]
        return {
            "clients_sampled": float(len(self.sampled)),
            "clients_reported": float(len(steps)),
            "clients_dropped": float(len(self.dropped)),
            "mean_local_steps": float(np.mean(steps)) if steps else float("nan"),
        }


def draw(distribution: Any, rng: np.random.Generator) -> float:
    """One value of a `federation.system` distribution: a constant, a range or a choice."""
    if isinstance(distribution, IntRange):
        return int(rng.integers(distribution.low, distribution.high, endpoint=True))
    if isinstance(distribution, Range):
        return float(rng.uniform(distribution.low, distribution.high))
    if isinstance(distribution, list):
        return distribution[int(rng.integers(len(distribution)))]
    return distribution


def steps_for_epochs(epochs: float, n: int, batch_size: int) -> int:
    """Local steps of `epochs` passes over n samples in batches."""
    return max(1, math.ceil(epochs * math.ceil(n / batch_size)))


def num_local_steps(fed: FederationSpec, n: int, epochs_scale: float = 1.0) -> int:
    """The federation's local work for a client of n samples, in steps (without the section:
    every client's work in every round)."""
    if fed.local_steps is not None:
        return fed.local_steps
    return steps_for_epochs(fed.local_epochs * epochs_scale, n, fed.batch_size)


def counts_steps(fed: FederationSpec) -> bool:
    """True when local work (and the deadline) is counted in steps, False in epochs."""
    system = fed.system or SystemSpec()
    if system.sets_local_work():
        return system.local_steps is not None
    return fed.local_steps is not None


def local_steps(fed: FederationSpec, seed: int, rnd: int, client: int, n: int) -> int:
    """The client's full local work this round, in steps."""
    system = fed.system or SystemSpec()
    if not system.sets_local_work():
        return num_local_steps(fed, n)
    when = (rnd,) if system.redraw == "round" else ()
    rng = numpy_rng(seed, "system", "work", *when, client)
    if system.local_steps is not None:
        return int(draw(system.local_steps, rng))
    return steps_for_epochs(draw(system.local_epochs, rng), n, fed.batch_size)


def available(fed: FederationSpec, seed: int, rnd: int, holders: list[int]) -> list[int]:
    """The holders available this round: each with its own probability, drawn once."""
    system = fed.system or SystemSpec()
    if system.availability == 1.0:
        return list(holders)
    return [
        c
        for c in holders
        if numpy_rng(seed, "system", "available", rnd, c).random()
        < draw(system.availability, numpy_rng(seed, "system", "availability", c))
    ]


def drops_out(fed: FederationSpec, seed: int, rnd: int, client: int) -> bool:
    system = fed.system or SystemSpec()
    return numpy_rng(seed, "system", "dropout", rnd, client).random() < system.dropout


def steps_by_deadline(fed: FederationSpec, seed: int, client: int, n: int) -> int | None:
    """Steps the client completes by the deadline: floor(speed * deadline * steps per unit of
    work), its speed drawn once; None without a deadline."""
    system = fed.system or SystemSpec()
    if system.deadline is None:
        return None
    speed = draw(system.speed, numpy_rng(seed, "system", "speed", client))
    per_unit = 1 if counts_steps(fed) else math.ceil(n / fed.batch_size)
    return math.floor(speed * system.deadline * per_unit)


def plan_round(
    fed: FederationSpec,
    seed: int,
    rnd: int,
    sizes: list[int],
    holders: list[int],
    per_round: int,
    sample: Sampler,
) -> RoundPlan:
    """The round's plan: `per_round` clients sampled among the available holders (all of them
    when fewer are available), then each one's work, dropout and deadline."""
    system = fed.system or SystemSpec()
    sampled = sample(seed, rnd, available(fed, seed, rnd, holders), per_round)
    steps, dropped = {}, {}
    for c in sampled:
        full = local_steps(fed, seed, rnd, c, sizes[c])
        done = steps_by_deadline(fed, seed, c, sizes[c])
        if drops_out(fed, seed, rnd, c):
            dropped[c] = DROPOUT
        elif done is None or done >= full:
            steps[c] = full
        elif system.stragglers == "partial" and done > 0:
            steps[c] = done
        else:
            dropped[c] = DEADLINE
    return RoundPlan(tuple(sampled), steps, dropped)
