"""A spec file's mapping: its YAML read, the spec it derives from (`base:`) merged under it."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from fedhet.core.errors import InputError


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: spec file not found; pass the path of a YAML spec (see specs/)")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        message = f"{path}: cannot read the spec ({err}); pass a readable UTF-8 YAML file"
        raise InputError(message) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise InputError(f"{path}:{where}: YAML syntax error: {problem}") from None
    return data


def load_mapping(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict:
    """A spec file's mapping, `base: OTHER.yaml` resolved: OTHER's mapping (a path relative to
    this file, itself resolved the same way) with this file's fields merged over it
    (`derived`); a matrix axis set to null is dropped."""
    data = load_yaml(path)
    if not isinstance(data, dict) or "base" not in data:
        return data
    here = Path(path).resolve()
    base = data.pop("base")
    if not isinstance(base, str):
        raise InputError(f"{path}: base: give the path of the spec this one derives from")
    base_path = (here.parent / base).resolve()
    if base_path in (*_seen, here):
        raise InputError(f"{path}: base: {base} derives from itself; break the cycle")
    merged = derived(load_mapping(base_path, (*_seen, here)), data)
    if isinstance(merged.get("matrix"), dict):  # an axis set to null is dropped
        merged["matrix"] = {a: v for a, v in merged["matrix"].items() if v is not None}
    return merged


def derived(base: dict, changes: dict) -> dict:
    """`changes` merged over `base`: a section merges field by field, except a section whose
    choice (an algorithm's `name`, a partition's `scheme`) changes, which is replaced whole, as
    is every other value (a matrix axis's list included)."""
    merged = copy.deepcopy(base)
    for field, value in changes.items():
        old = merged.get(field)
        if isinstance(old, dict) and isinstance(value, dict) and not _choice_changes(old, value):
            merged[field] = derived(old, value)
        else:
            merged[field] = copy.deepcopy(value)
    return merged


def _choice_changes(old: dict, new: dict) -> bool:
    return any(tag in new and new[tag] != old.get(tag) for tag in ("name", "scheme", "arch"))
