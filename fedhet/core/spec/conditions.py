"""Fields that apply to some options only (a simple_cnn's `channels`, GroupNorm's `groups`):
declared with `applies_when`, checked across a spec's runs (`unused_setting`), and left out of
what `fedhet spec show` prints (`pruned`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


def applies_when(**choices: tuple[str, ...]) -> dict[str, Any]:
    """Field metadata: the field only matters when each named sibling has one of these values
    (`spec show` leaves it out otherwise; the JSON Schema says so as `applies_when`)."""
    return {"json_schema_extra": {"applies_when": {k: list(v) for k, v in choices.items()}}}


def _conditions(section: type[BaseModel]) -> dict[str, dict[str, list[str]]]:
    """field -> {sibling: values} for the fields that apply only when siblings take those values."""
    found = {}
    for name, info in section.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if "applies_when" in extra:
            found[name] = extra["applies_when"]
    return found


def _applies(section: BaseModel, when: dict[str, list[str]]) -> bool:
    return all(getattr(section, k, None) in choices for k, choices in when.items())


def unused_setting(runs: list[BaseModel]) -> tuple[tuple[str, str], str, Any] | None:
    """(location, message, value) of a field set away from its default in runs where it does
    not apply and in no other run; None when every set field applies somewhere (a matrix over
    `model.arch` may give `channels` to its simple_cnn runs only)."""
    for section_name in type(runs[0]).model_fields:
        sections = [getattr(run, section_name) for run in runs]
        if not isinstance(sections[0], BaseModel):
            continue
        for name, when in _conditions(type(sections[0])).items():
            default = type(sections[0]).model_fields[name].get_default(call_default_factory=True)
            setting = [s for s in sections if getattr(s, name, default) != default]
            if setting and not any(_applies(s, when) for s in setting):
                options = "; ".join(f"{k} {', '.join(v)}" for k, v in when.items())
                siblings = " or ".join(f"{section_name}.{k}" for k in when)
                message = f"applies to {options} only; remove it or set {siblings}"
                return (section_name, name), message, getattr(setting[0], name)
    return None


def pruned(section: BaseModel, data: dict[str, Any]) -> dict[str, Any]:
    """`data`, the section's dump, less the fields that do not apply to the options chosen, at
    every depth; a field the section sets explicitly is kept."""
    conditions = _conditions(type(section))
    for name in type(section).model_fields:
        if name not in data:
            continue
        applies = _applies(section, conditions.get(name, {}))
        value = getattr(section, name)
        if not applies and name not in section.model_fields_set:
            del data[name]
        elif isinstance(value, BaseModel) and isinstance(data[name], dict):
            pruned(value, data[name])
    return data
