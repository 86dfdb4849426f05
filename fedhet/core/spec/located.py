"""A validation error placed at a field, for the checks that see more than the field: a section's
model validator, the loader's checks across a matrix's runs (fedhet.core.spec.loading)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticCustomError


def located_error(loc: tuple[str, ...], message: str, value: Any) -> ValidationError:
    """A validation error at `loc` (relative to the model being validated)."""
    error = PydanticCustomError("spec", message)
    return ValidationError.from_exception_data(
        "Spec", [{"type": error, "loc": loc, "input": value}]
    )
