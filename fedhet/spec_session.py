"""A checked spec and what it says before any store is read: its runs, the spec with every
default filled in, every stage's key. `fedhet spec validate`, `show` and `hash` present it;
`fedhet.session.Session` (every command of a spec, and `fedhet.Experiment`) is one over a
store. Both are opened through `checked`, the one road from a spec to a checked Spec.

Light to import: planning (and with it the methods' code) waits for `planned`; no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from fedhet.core.spec import Spec
from fedhet.execution.caller import Voice
from fedhet.execution.loading import checked_spec

if TYPE_CHECKING:
    from fedhet.execution.planning import Run

Rows = list[dict[str, Any]]


@dataclass
class SpecSession:
    """A checked spec (read from `where`: its file, or "spec" for a mapping); `voice` words the
    messages, `console` hears progress notes."""

    spec: Spec
    where: Path
    voice: Voice
    console: Console

    @cached_property
    def planned(self) -> list[Run]:
        """The spec's runs (planned on first use: planning imports the methods' code)."""
        from fedhet.execution.planning import runs_of

        return runs_of(self.spec)

    @cached_property
    def run_specs(self) -> list[Spec]:
        """A spec per run, one per combination of the matrix's values, unplanned (so no
        method's code is imported)."""
        from fedhet.core.spec import expand

        return expand(self.spec)

    def filled(self) -> dict[str, Any]:
        """The spec with every default filled in, less the fields that do not apply to the
        chosen model and partition (what `fedhet spec show` prints)."""
        from fedhet.core.spec import applicable_dump

        return applicable_dump(self.spec)

    def key_rows(self) -> Rows:
        """A row per run and stage (what `fedhet spec hash` prints): `run` (its place in the
        spec's runs, from 0), `label` (the run's), `stage`, `key`; each run's stages from the
        first upstream to the run's own."""
        return [
            {"run": i, "label": run.label, "stage": node.stage, "key": node.key}
            for i, run in enumerate(self.planned)
            for node in run.node.walk()
        ]


def open_spec_session(
    source: str | Path | Mapping[str, Any],
    overrides: Sequence[str],
    voice: Voice,
    console: Console,
    only: Sequence[str] = (),
    note: Callable[[str], None] = lambda line: None,
) -> SpecSession:
    """The spec session of a spec file (or a mapping) with `overrides` (PATH=VALUE) and `only`
    filters (AXIS=VALUE); InputError for a spec fedhet refuses. `note` hears one line per matrix
    axis an override replaces."""
    spec = checked(source, overrides, only, None, note)
    return SpecSession(spec, located(source), voice, console)


def located(source: str | Path | Mapping[str, Any]) -> Path:
    """Where messages say a spec comes from: its file, or "spec" for a mapping."""
    return Path("spec") if isinstance(source, Mapping) else Path(source)


def checked(
    source: str | Path | Mapping[str, Any],
    overrides: Sequence[str] = (),
    only: Sequence[str] = (),
    data_root: Path | None = None,
    note: Callable[[str], None] = lambda line: None,
) -> Spec:
    """A spec checked as every command and `fedhet.load` check it (no store opened), its data
    root replaced by `data_root` where given."""
    spec = checked_spec(source, overrides, only, note)
    if data_root is None:
        return spec
    return spec.model_copy(update={"data": spec.data.model_copy(update={"root": str(data_root)})})
