"""A command's result rows as a table for people (fitting the terminal: labels wrap, numbers never
do), or as markdown, CSV or JSON for other programs.

Tables and markdown show formatted cells (accuracies in %, times in seconds); CSV and JSON keep the
raw values under the columns' keys (accuracies as fractions, NaN as empty/null).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from rich.console import Console
from rich.table import Table


class Format(StrEnum):
    table = "table"
    markdown = "markdown"
    csv = "csv"
    json = "json"


Kind = Literal["text", "number", "pct", "seconds", "megabytes"]


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    kind: Kind = "text"  # text wraps in a narrow terminal; every other kind is kept whole

    @property
    def numeric(self) -> bool:
        return self.kind != "text"


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def cell(value: Any, kind: Kind) -> str:
    """What a person reads for a value; a non-number in a numeric column is shown as it is."""
    if _missing(value):
        return "-"
    if not isinstance(value, int | float) or isinstance(value, bool):
        return str(value)
    if kind == "pct":
        return f"{100 * value:.2f}"
    if kind == "seconds":
        return f"{value:.1f}"
    if kind == "megabytes":
        return f"{value / 1e6:.2f}"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.4g}"
    return str(int(value)) if isinstance(value, float) else str(value)


def _raw(value: Any) -> Any:
    if _missing(value):
        return None
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return value


def render(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[Column],
    fmt: Format,
    title: str | None = None,
) -> str | Table:
    """A rich Table for `table` (print it on a console), text for the other formats."""
    if fmt is Format.table:
        return _table(rows, columns, title)
    if fmt is Format.markdown:
        return _markdown(rows, columns, title)
    if fmt is Format.csv:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow([c.key for c in columns])
        for row in rows:
            writer.writerow(["" if _missing(v) else v for v in (row.get(c.key) for c in columns)])
        return buffer.getvalue()
    records = [{c.key: _raw(row.get(c.key)) for c in columns} for row in rows]
    return json.dumps(records, indent=2, default=str) + "\n"


def show(
    console: Console,
    rows: Sequence[dict[str, Any]],
    columns: Sequence[Column],
    fmt: Format,
    title: str | None = None,
) -> None:
    """Print the rows; text formats go out unwrapped (a pipe gets them verbatim)."""
    rendered = render(rows, columns, fmt, title)
    if isinstance(rendered, Table):
        console.print(rendered)
    else:
        console.file.write(rendered)
        console.file.flush()


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[Column], title: str | None) -> Table:
    table = Table(title=title, title_justify="left")
    for col in columns:
        if col.numeric:
            table.add_column(col.header, justify="right", no_wrap=True)
        else:
            table.add_column(col.header, overflow="fold")
    for row in rows:
        table.add_row(*(cell(row.get(c.key), c.kind) for c in columns))
    return table


def _markdown(rows: Sequence[dict[str, Any]], columns: Sequence[Column], title: str | None) -> str:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    lines = [f"**{title}**", ""] if title else []
    lines.append(line([c.header for c in columns]))
    lines.append("|" + "|".join("---:" if c.numeric else "---" for c in columns) + "|")
    lines += [line([cell(row.get(c.key), c.kind) for c in columns]) for row in rows]
    return "\n".join(lines) + "\n\n"
