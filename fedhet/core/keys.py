"""Content hashes of pipeline stages.

key = sha256(canonical JSON of {stage, version, config, upstream}), where canonical JSON has
sorted keys, no whitespace, floats in repr form and enums by value.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
from enum import Enum
from typing import Any


def _canonical(value: Any) -> Any:
    if isinstance(value, Enum):
        return _canonical(value.value)
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, (bool, str)) or value is None:
        return value
    if isinstance(value, numbers.Integral):  # numpy integers hash like Python ints
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)  # numpy floats: repr(np.float64(x)) is not repr(x)
        if not math.isfinite(value):
            raise ValueError(f"non-finite float {value!r} cannot enter a key")
        return {"float": repr(value)}  # repr round-trips exactly; ints stay distinct from floats
    return value


def canonical_json(value: Any) -> str:
    return json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def stage_key(stage: str, version: int, config: dict[str, Any], upstream: dict[str, str]) -> str:
    payload = {"stage": stage, "version": version, "config": config, "upstream": upstream}
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()
