"""Loading a spec, from a file (its YAML, `base:`, command-line overrides and `--only` filters)
or from a mapping, validated whole: the spec itself, then its runs, expanded once, together (a
field set for options that no run takes, a tune that cannot run over them). The schema
(fedhet.core.spec.root) knows nothing of this step, so one run validates alone."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedhet.core.errors import InputError
from fedhet.core.spec.conditions import unused_setting
from fedhet.core.spec.located import located_error
from fedhet.core.spec.matrix import expand, parse_run
from fedhet.core.spec.overrides import apply_overrides, keep_only, override_path
from fedhet.core.spec.root import Spec
from fedhet.core.spec.wording import one_line, validated
from fedhet.core.spec.yaml_file import load_mapping
from fedhet.core.tune_spec import Problem, tune_problem


def parse_spec(data: Any, source: str = "spec") -> Spec:
    """Validate a mapping into a Spec, raising InputError with a one-line message."""
    return _validated_whole(data, source)


def load_spec(path: str | Path, overrides: Sequence[str] = (), only: Sequence[str] = ()) -> Spec:
    """The spec in the file at `path`, with command-line `overrides` (PATH=VALUE) applied to its
    mapping before validation, so they give exactly the keys an edit of the file would, and its
    matrix restricted by the `only` filters (AXIS=VALUE; fedhet.core.spec.overrides)."""
    data = keep_only(apply_overrides(load_mapping(path), overrides), only)
    return _validated_whole(data, str(path), overrides)


def _validated_whole(data: Any, source: str, overrides: Sequence[str] = ()) -> Spec:
    spec = validated(data, source, overrides)
    try:
        runs = [run for _, run in expand(spec)]
    except InputError as err:
        # matrix axes are any string to pydantic: expanding checks them
        changed = [o for o in overrides if override_path(o)[0] == "matrix"]
        if changed:
            raise InputError(f"override {changed[0]!r}: {err}") from None
        return spec  # `expand` names the run that is invalid
    problem = unused_setting(runs) or _tune_problem(spec, runs)
    if problem is not None:
        raise InputError(one_line(located_error(*problem), source, data, overrides))
    return spec


def _tune_problem(spec: Spec, runs: list[Spec]) -> Problem | None:
    if spec.tune is None:
        return None
    return tune_problem(spec.tune, runs, list(spec.matrix or {}), parse_run)
