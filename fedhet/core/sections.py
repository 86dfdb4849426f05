"""The base classes of every spec section, including the algorithm block's."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_serializer


class Section(BaseModel):
    # inf/nan would pass range checks like gt=0 and cannot enter a key
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class AlgorithmSpec(Section):
    """Base of every algorithm's config; each algorithm declares its own subclass."""

    name: str
    # Fields added by local-objective wrappers (e.g. `vhl`), set by the registry. A wrapper that
    # is off is absent from the dump, so runs without it keep the keys they always had.
    objective_fields: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _leave_out_objectives_that_are_off(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        for field in self.objective_fields:
            if getattr(self, field) is None:
                data.pop(field, None)
        return data

    def label(self) -> str:
        """Row label in reports: the name, then each objective wrapper that is on."""
        wrappers = [getattr(self, f) for f in self.objective_fields]
        return "+".join([self.base_label(), *(w.label() for w in wrappers if w is not None)])

    def base_label(self) -> str:
        """The algorithm's own part of the label; methods with variants extend it."""
        return self.name
