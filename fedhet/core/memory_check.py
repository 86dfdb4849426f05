"""Refuse a spec whose models would not fit in this machine's memory, before anything is
allocated: counted from each run's architecture description and its dataset's shape."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fedhet.core.architectures import ARCHITECTURES, describe
from fedhet.core.errors import InputError
from fedhet.core.spec import DataSpec, Spec, expand
from fedhet.process.memory import shortage


def require_models_fit(
    spec: Spec, where: Path, shape_of: Callable[[DataSpec], tuple[tuple[int, int, int], int]]
) -> None:
    """Refuse a spec any of whose runs' models would not fit in memory, counted from the
    model's description and its input's (image shape, classes), `shape_of(run.data)`."""
    for _, run in expand(spec):
        image, classes = shape_of(run.data)
        count = run.model.parameter_count(image, classes)
        if count is None:  # a plug-in's model that cannot be counted without building it
            continue
        builtin = run.model.arch in ARCHITECTURES
        shrink = describe(run.model, image, classes).shrink if builtin else "shrink the model"
        message = shortage(count, f"{where}: model ({run.model.arch})", shrink)
        if message is not None:
            raise InputError(message)
