"""The one road from a spec (a YAML file or a mapping, with overrides) to a checked Spec, taken
by every entry point: the command line (fedhet.cli) and the Python API (`fedhet.load`), so both
refuse the same specs with the same one-line messages. Light: it imports no torch, so
`fedhet spec validate` stays fast."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedhet.core.memory_check import require_models_fit
from fedhet.core.spec import (
    Spec,
    apply_overrides,
    load_mapping,
    load_spec,
    parse_spec,
    replaced_axes,
)
from fedhet.core.spec.overrides import keep_only
from fedhet.data.shapes import data_shape
from fedhet.data.sizes import require_a_sample_per_client


def checked_spec(
    source: str | Path | Mapping[str, Any],
    overrides: Sequence[str] = (),
    only: Sequence[str] = (),
    note: Callable[[str], None] = lambda line: None,
) -> Spec:
    """The validated spec of a file (or of a mapping, named "spec" in messages) with the
    `overrides` (PATH=VALUE) and `only` filters (AXIS=VALUE) applied, each run's clients holding
    a sample and its model fitting in memory; InputError otherwise. `note` hears one line per
    matrix axis an override replaces."""
    if isinstance(source, Mapping):
        where, mapping = Path("spec"), dict(source)
        spec = parse_spec(keep_only(apply_overrides(mapping, overrides), only), str(where))
    else:
        where = Path(source)
        spec = load_spec(where, overrides, only)
        mapping = load_mapping(where)
    for line in replaced_axes(mapping, overrides):
        note(line)
    require_a_sample_per_client(spec, where)
    require_models_fit(spec, where, data_shape)
    return spec
