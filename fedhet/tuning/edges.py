"""Where a tune's choice lies at the edge of what it tried, and the grid value past that edge.

An edge: the chosen value of a numeric grid or range is the lowest or the highest value its
trials tried (a choice's values are categories: no edge), so the optimum may lie beyond it. The
value past a grid's edge is one more step in the grid's own spacing: a series that repeats
every decade (0.001, 0.003, 0.01 -> 0.03; 0.02, 0.05, 0.1, 0.2 -> 0.5) continues it; otherwise
equal ratios (two values, or 1, 2, 4 -> 8) continue geometrically, equal differences (1, 2, 3
-> 4) arithmetically, and an uneven grid repeats its outermost step (a ratio where every value
is positive, a difference otherwise). A grid of integers stays one."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

Side = Literal["lowest", "highest"]


@dataclass(frozen=True)
class Edge:
    path: str
    value: float
    side: Side
    kind: str  # the dimension's: grid, uniform or log_uniform
    # why the grid was not extended past it: None where extending was off (tune.extend_edges: 0)
    stop: str | None = None


def edges_of(
    kinds: dict[str, str], tried: Sequence[dict[str, Any]], chosen: dict[str, Any]
) -> list[Edge]:
    """The chosen values that are the lowest or highest of their dimension's values tried
    (`kinds`: path -> the dimension's kind; a dimension tried at one value has no edge)."""
    edges = []
    for path, kind in kinds.items():
        values = {v[path] for v in tried if _numeric(v.get(path))}
        if kind == "choice" or len(values) < 2 or not _numeric(chosen.get(path)):
            continue
        if chosen[path] in (min(values), max(values)):
            side: Side = "lowest" if chosen[path] == min(values) else "highest"
            edges.append(Edge(path, chosen[path], side, kind))
    return edges


def kind_of(description: str) -> str:
    """The kind of a dimension from its description (`grid [0.01, 0.1]`, `log-uniform [..]`)."""
    return description.split(" ", 1)[0].replace("-", "_")


def past(grid: Sequence[Any], side: Side) -> float | int:
    """The value one step past the grid's lowest or highest value, in its own spacing."""
    values = sorted(set(grid))
    value = _beyond(values, up=side == "highest")
    if all(isinstance(v, int) for v in values):
        return round(value)
    return float(f"{value:.12g}")  # 0.003 * 10 is 0.030000000000000002


def _beyond(values: list[Any], up: bool) -> float:
    n, positive = len(values), values[0] > 0
    for period in range(1, n) if positive else ():  # a series that repeats every decade
        if all(_close(values[i + period], 10 * values[i]) for i in range(n - period)):
            return 10 * values[n - period] if up else values[period - 1] / 10
    ratios = [b / a for a, b in zip(values, values[1:], strict=False)] if positive else []
    steps = [b - a for a, b in zip(values, values[1:], strict=False)]
    edge = values[-1] if up else values[0]
    if ratios and all(_close(r, ratios[0]) for r in ratios):
        ratio = ratios[0]
    elif all(_close(s, steps[0]) for s in steps):
        return edge + steps[0] if up else edge - steps[0]
    elif positive:  # uneven: the outermost step again
        ratio = ratios[-1] if up else ratios[0]
    else:
        return edge + steps[-1] if up else edge - steps[0]
    return edge * ratio if up else edge / ratio


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6)


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
