"""A spec's validation errors as one line each: where the first problem is (in the file, or
the override it comes from), what is wrong, and how to fix it."""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Sequence
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from fedhet.core.errors import InputError
from fedhet.core.spec.overrides import blame, flow_yaml
from fedhet.core.spec.root import Spec
from fedhet.core.spec.tagged import DISCRIMINATORS, tagged_union


def validated(data: Any, source: str, overrides: Sequence[str] = ()) -> Spec:
    """`data` validated into a Spec (the checks of one run); InputError with a one-line message
    when it is invalid, blamed on the override it comes from, if any."""
    if not isinstance(data, dict):
        raise InputError(f"{source}: a spec must be a YAML mapping, got {type(data).__name__}")
    try:
        return Spec.model_validate(data)
    except ValidationError as err:
        raise InputError(one_line(err, source, data, overrides)) from None


def one_line(err: ValidationError, source: str, data: Any, overrides: Sequence[str] = ()) -> str:
    """The first problem of `err`, an error of validating `data` from `source` (with
    `overrides` applied), as one line naming the field."""
    first = err.errors(include_url=False)[0]
    path, kind, ctx = _field_path(first["loc"], data), first["type"], first.get("ctx", {})
    if overrides:
        source = blame(source, overrides, path)
    value = first.get("input")
    if kind == "extra_forbidden":
        msg = _inapplicable_field(path, data, bool(overrides)) or _unknown_field(path, data)
    elif kind == "missing":
        msg = "required field is missing; add it"
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        path.append(ctx["discriminator"].strip("'"))
        if "tag" in ctx:
            msg = f"unknown value {ctx['tag']!r}; choose one of {ctx['expected_tags']}"
        else:
            msg = "missing; add it (`fedhet spec schema` lists the choices)"
    else:
        msg = first["msg"].removeprefix("Value error, ")
        msg = msg[:1].lower() + msg[1:]
        if path and not isinstance(value, dict | list):
            msg += f" (got {_short(value)})"
    more = err.error_count() - 1
    suffix = f" (+{more} more problem{'s' if more > 1 else ''})" if more else ""
    where = f"{'.'.join(path)}: " if path else ""
    return f"{source}: {where}{msg}{suffix}"


def _field_path(loc: tuple[int | str, ...], data: Any) -> list[str]:
    """The user's path to an error: pydantic's loc without the union tags it inserts right after
    a discriminated union's field (`partition.dirichlet.alpha` -> `partition.alpha`)."""
    path, node, entered = [], data, False
    for part in loc:
        tagged = isinstance(node, dict) and any(node.get(d) == part for d in DISCRIMINATORS)
        if (entered and tagged) or str(part).startswith("function-"):
            entered = False
            continue
        path.append(str(part))
        inside = isinstance(node, dict) and part in node
        inside |= isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        node, entered = (node[part] if inside else None), True
    return path


def _unknown_field(path: list[str], data: Any) -> str:
    """The message for a field no section takes: the spelling nearest to it among its section's
    fields (those of the scheme or algorithm chosen, of all when none is), if one is close."""
    models, node = [Spec], data
    for depth, part in enumerate(path[:-1]):
        node = node.get(part) if isinstance(node, dict) else None
        union = tagged_union(part) if depth == 0 else None
        if union is not None:
            tag, _, members = union
            chosen = members.get(node.get(tag)) if isinstance(node, dict) else None
            models = [chosen] if chosen else list(members.values())
        else:
            found = [m.model_fields[part].annotation for m in models if part in m.model_fields]
            models = [m for annotation in found for m in _models_in(annotation)]
    fields = {name for model in models for name in model.model_fields}
    close = difflib.get_close_matches(path[-1], fields, n=1)
    if close:
        return f"unknown field; did you mean {close[0]}?"
    return "unknown field; remove it or fix its spelling (`fedhet spec schema` lists the fields)"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The spec sections an annotation names (`RotationSpec | None`: RotationSpec)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _models_in(arg)]


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _inapplicable_field(path: list[str], data: Any, overridden: bool) -> str | None:
    """The message for a field its section's scheme (or algorithm) does not take but another
    does: where it applies, and how to drop it (with overrides: by replacing the section)."""
    union = tagged_union(path[0]) if len(path) == 2 else None
    if union is None:
        return None
    tag, kind, members = union
    owners = sorted(t for t, config in members.items() if path[1] in config.model_fields)
    if not owners:
        return None
    message = f"applies to {kind} {', '.join(owners)} only"
    section = data.get(path[0]) if isinstance(data, dict) else None
    chosen = members.get(section.get(tag)) if isinstance(section, dict) else None
    if not overridden or chosen is None:
        return f"{message}; remove it or set {path[0]}.{tag}"
    kept = {k: v for k, v in section.items() if k in chosen.model_fields}
    whole = flow_yaml(kept)
    return f"{message}; drop it by setting the whole section: {path[0]}={shlex.quote(whole)}"
