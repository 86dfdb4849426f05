"""The base classes of every spec section, including the algorithm block's."""

from __future__ import annotations

import types
from functools import cache
from typing import Annotated, Any, ClassVar, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_serializer,
    model_validator,
)


class OmitIfDefault:
    """Field marker, `Annotated[T, OMIT_IF_DEFAULT]`: the field is left out of dumps (hence of
    keys) while it holds its default, so adding an option keeps every existing key."""


OMIT_IF_DEFAULT = OmitIfDefault()


# Seeds reach torch.Generator.manual_seed, which takes at most 64 bits; 63 keep them positive int64
MAX_SEED = 2**63 - 1
# Upper bounds of the other numeric fields: counts that loops, batches and int64 tensors can
# honour. A model whose widths pass them but whose parameters would not fit in memory is refused
# when the spec is loaded (`fedhet.process.memory`).
MAX_COUNT = 10**6  # rounds, steps, samples, batch sizes, chunk sizes
MAX_WIDTH = 10**6  # layer widths and feature dimensions
MAX_LAYERS = 64
MAX_CLASSES = 10**4
MAX_CLIENTS = 10**5
MAX_THREADS = 1024
MAX_FACTOR = 10**6  # floats that scale a count or a distribution (alpha, epochs)

# The bounded types that fields of many sections share (each field adds default and description)
Count = Annotated[int, Field(ge=1, le=MAX_COUNT)]  # rounds, steps, samples, batch sizes
Share = Annotated[float, Field(gt=0, lt=1)]  # a part of a whole: neither none of it nor all
Clients = Annotated[int, Field(ge=1, le=MAX_CLIENTS)]  # a number of clients
Width = Annotated[int, Field(ge=1, le=MAX_WIDTH)]  # a layer's width, a feature dimension
Epochs = Annotated[float, Field(gt=0, le=MAX_FACTOR)]  # passes over a client's data (1.5 too)
LearningRate = Annotated[float, Field(gt=0)]  # the step size of an optimizer
Weight = Annotated[float, Field(ge=0)]  # of a loss term, or a weight decay: 0 turns it off
Momentum = Annotated[float, Field(ge=0, lt=1)]  # the decay of a running average (0: none)


def _kinds(annotation: Any) -> set[Any]:
    """The types a field of type `annotation` takes: a union's members, Annotated's stripped."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _kinds(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return set().union(*(_kinds(member) for member in get_args(annotation)))
    return {annotation}


@cache
def _number_error(annotation: Any) -> str | None:
    """pydantic's error type for a boolean given to a field of this type when the field takes a
    number (an int or a float, maybe None) and no boolean; None for any other field."""
    kinds = _kinds(annotation)
    if bool in kinds:
        return None
    return "int_type" if int in kinds else "float_type" if float in kinds else None


@cache
def _item_type(annotation: Any) -> Any:
    """The type of the items of a list or tuple field (its first's: `tuple[float, float]`)."""
    sequences = [k for k in _kinds(annotation) if get_origin(k) in (list, tuple)]
    return get_args(sequences[0])[0] if sequences else None


def _boolean_number(annotation: Any, value: Any, loc: tuple) -> dict[str, Any] | None:
    """The validation error of the first boolean in `value` (an item of a list or tuple too)
    where `annotation` takes a number; None when there is none."""
    if isinstance(value, bool):
        kind = _number_error(annotation)
        return None if kind is None else {"type": kind, "loc": loc, "input": value}
    item = _item_type(annotation) if isinstance(value, list | tuple) else None
    if item is None:
        return None
    found = (_boolean_number(item, v, (*loc, i)) for i, v in enumerate(value))
    return next((error for error in found if error is not None), None)


class Section(BaseModel):
    # inf/nan would pass range checks like gt=0 and cannot enter a key
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_boolean_numbers(cls, data: Any) -> Any:
        """true/false given for a count or another number (pydantic would read true as 1)."""
        for name, value in data.items() if isinstance(data, dict) else ():
            field = cls.model_fields.get(name)
            error = None if field is None else _boolean_number(field.annotation, value, (name,))
            if error is not None:
                raise ValidationError.from_exception_data(cls.__name__, [error])
        return data

    @model_serializer(mode="wrap")
    def _leave_out_omitted(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        for name in self.omitted_fields():
            data.pop(name, None)
        return data

    def omitted_fields(self) -> list[str]:
        """Fields left out of the dump: those marked OMIT_IF_DEFAULT that hold their default."""
        return [
            name
            for name, info in type(self).model_fields.items()
            if any(isinstance(m, OmitIfDefault) for m in info.metadata)
            and getattr(self, name) == info.get_default(call_default_factory=True)
        ]


class AlgorithmSpec(Section):
    """Base of every algorithm's config; each algorithm declares its own subclass."""

    name: str
    # Fields added by local-objective wrappers (e.g. `vhl`), set by the registry. A wrapper that
    # is off is absent from the dump, so runs without it keep the keys they always had.
    objective_fields: ClassVar[tuple[str, ...]] = ()
    # True when a local-objective wrapper (VHL) may replace the data term of the local loss
    accepts_objectives: ClassVar[bool] = False
    # The algorithm's name as its paper spells it (FedAvg, SCAFFOLD, pFedMe), in every label
    # people read; None: the spec's `name`. Labels never enter a key.
    display_name: ClassVar[str | None] = None

    def omitted_fields(self) -> list[str]:
        off = [field for field in self.objective_fields if getattr(self, field) is None]
        return [*super().omitted_fields(), *off]

    def check(self, spec: Any) -> None:
        """Checks against the rest of the spec (a `fedhet.core.spec.Spec`), run when it is
        validated; raise InputError naming the field. None by default."""

    def label(self) -> str:
        """The label people read (report rows, figure legends, tables): the display name joined
        by '+' to each objective wrapper that is on, then the non-default settings in one
        parenthesis, comma-separated: `FedBR (tau=0.5/0.5, index pairs, momentum=0.9)`."""
        name, settings = self.label_parts()
        return labelled(name, settings)

    def label_parts(self) -> tuple[str, list[str]]:
        """The label's name and settings apart: a report's row adds the matrix axes that tell
        its group apart to the settings (fedhet.execution.labels)."""
        wrappers = [w for w in (getattr(self, f) for f in self.objective_fields) if w is not None]
        name = "+".join([self.display_name or self.name, *(w.display_name() for w in wrappers)])
        wrapped = [setting for w in wrappers for setting in w.settings()]
        return name, [*self.settings(), *wrapped, *self.shared_settings()]

    def settings(self) -> list[str]:
        """The algorithm's non-default settings a label names, each `symbol=value` or a short
        phrase (`index pairs`) without commas or parentheses; none by default."""
        return []

    def shared_settings(self) -> list[str]:
        """Settings every algorithm has (the clients' momentum), named after its own."""
        return []


def labelled(name: str, settings: list[str]) -> str:
    """`name (setting, setting)`, or the name alone without settings: the one style of every
    label of a method."""
    return f"{name} ({', '.join(settings)})" if settings else name
