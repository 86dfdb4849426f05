"""`federation.system`: what the clients' devices do to a round (system heterogeneity).

Heterogeneous local work, availability for sampling, dropout before reporting, and stragglers
under a round deadline. Each distributed quantity is a number (a constant), `{low, high}` (a
uniform draw: integers for local work, reals for rates) or a list of choices (drawn uniformly).
The section is absent (None) by default and whenever it only holds defaults, so a spec without it
keeps every key it had; `fedhet.engine.system` makes the draws.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    WrapValidator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from fedhet.core.sections import MAX_FACTOR, Count, Section


class Range(Section):
    """Uniform on low..high: the integers from low to high for an IntRange, else the reals in
    [low, high)."""

    low: float
    high: float

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.low > self.high:
            raise ValueError(f"low={self.low} exceeds high={self.high}; swap them")
        return self


class IntRange(Range):
    low: Count
    high: Count


class ProbabilityRange(Range):
    low: float = Field(ge=0, le=1)
    high: float = Field(gt=0, le=1)


class SpeedRange(Range):
    low: float = Field(gt=0, le=MAX_FACTOR)
    high: float = Field(gt=0, le=MAX_FACTOR)


def _shape(value: Any) -> str:
    if isinstance(value, dict | BaseModel):
        return "range"
    return "choices" if isinstance(value, list) else "value"


def _one_line(value: Any, handler: Any) -> Any:
    """Errors of a distribution without pydantic's shape tag: named from inside it (`low: ...`),
    or, for the value itself, with the shapes it may take."""
    try:
        return handler(value)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        inner = ".".join(str(part) for part in first["loc"][1:])
        msg = first["msg"].removeprefix("Value error, ")
        msg = f"{msg[:1].lower()}{msg[1:]}"
        msg = f"{inner}: {msg}" if inner else f"{msg}; give a number, {{low, high}} or a list"
        raise PydanticCustomError("distribution", "{msg}", {"msg": msg}) from None


def _distribution(number: Any, range_: type[Range], choice: Any) -> Any:
    """A constant `number`, a `range_` mapping, or a non-empty list of `choice` values."""
    union = (
        Annotated[number, Tag("value")]
        | Annotated[range_, Tag("range")]
        | Annotated[list[choice], Tag("choices"), Field(min_length=1)]
    )
    return Annotated[union, Discriminator(_shape), WrapValidator(_one_line)]


Epochs = Annotated[float, Field(gt=0, le=MAX_FACTOR)]
Probability = Annotated[float, Field(gt=0, le=1)]
Speed = Annotated[float, Field(gt=0, le=MAX_FACTOR)]

EpochsDistribution = _distribution(Epochs, IntRange, Epochs)
StepsDistribution = _distribution(Count, IntRange, Count)
ProbabilityDistribution = _distribution(Probability, ProbabilityRange, Probability)
SpeedDistribution = _distribution(Speed, SpeedRange, Speed)


class SystemSpec(Section):
    """What clients can do; the defaults are today's federation (every client available, none
    dropping out, the same local work for all, no deadline)."""

    local_epochs: EpochsDistribution | None = Field(
        None, description="each client's local epochs in a round (replaces federation's)"
    )
    local_steps: StepsDistribution | None = Field(
        None, description="each client's local steps in a round (replaces federation's)"
    )
    redraw: Literal["round", "fixed"] = Field(
        "round", description="local work drawn per client per round, or once per client"
    )
    availability: ProbabilityDistribution = Field(
        1.0, description="per client (drawn once): probability of being available in a round"
    )
    dropout: float = Field(
        0.0, ge=0, lt=1, description="probability that a sampled client drops out unreported"
    )
    speed: SpeedDistribution = Field(
        1.0, description="per client (drawn once): local work done per unit of time"
    )
    deadline: float | None = Field(
        None,
        gt=0,
        le=MAX_FACTOR,
        description="time per round, in units of the local work (epochs, or steps where local "
        "steps are set) at speed 1; default: none",
    )
    stragglers: Literal["partial", "drop"] = Field(
        "partial", description="a client late at the deadline reports the work it did, or none"
    )

    @model_validator(mode="after")
    def _effective_settings(self) -> SystemSpec:
        if self.local_epochs is not None and self.local_steps is not None:
            raise ValueError("set either local_epochs or local_steps, not both")
        if self.redraw != "round" and self.local_epochs is None and self.local_steps is None:
            raise ValueError("redraw needs local_epochs or local_steps to draw; set one")
        if self.deadline is None and (self.speed != 1.0 or self.stragglers != "partial"):
            raise ValueError("speed and stragglers act only at a deadline; set deadline")
        return self

    def sets_local_work(self) -> bool:
        return self.local_epochs is not None or self.local_steps is not None


def absent_when_default(value: SystemSpec | None) -> SystemSpec | None:
    """None for a section holding only defaults: it behaves as no section, so it keys as none."""
    return None if value == SystemSpec() else value
