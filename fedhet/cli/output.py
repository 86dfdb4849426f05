"""A command's result rows as a table for people (fitting the terminal: labels wrap between words,
the leftmost first kept whole where the width allows; numbers never wrap, their headers only
between words when the labels need the room), or as markdown, CSV or JSON for other programs.
A table piped to another program (no terminal, no COLUMNS asking for a width) keeps every cell
whole on one line, however wide.

Every format shows the rows' stored quantities in their shown units (fedhet.core.units: accuracies
in percent). Tables and markdown show formatted cells (accuracies to 2 decimals, times in
seconds); CSV and JSON the values in full under the columns' shown names (`best_test_pct`; NaN as
empty/null).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Literal

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from fedhet.core import units


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
    # text wraps in a narrow terminal; every other kind is kept whole. pct: a quantity stored as
    # a fraction (its key is in units.FRACTIONS), shown in percent
    kind: Kind = "text"
    optional: bool = False  # shown only when some row has a value

    @property
    def numeric(self) -> bool:
        return self.kind != "text"


def present(columns: list[Column], rows: list[dict]) -> list[Column]:
    """The columns less the optional ones no row has a value for (`test at best val` without a
    validation split)."""
    return [c for c in columns if not c.optional or any(not _missing(r.get(c.key)) for r in rows)]


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def cell(value: Any, kind: Kind) -> str:
    """What a person reads for a value; a non-number in a numeric column is shown as it is."""
    if _missing(value):
        return "-"
    if not isinstance(value, int | float) or isinstance(value, bool):
        return str(value)
    if kind == "pct":  # already in percent (render converts)
        return f"{value:.2f}"
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
    width: int | None = 80,
) -> str | Table:
    """A rich Table for `table` (print it on a console `width` wide; None: its cells whole, as
    wide as they need), text for the other formats; the rows hold stored quantities
    (accuracies as fractions)."""
    rows = [units.shown_row(row) for row in rows]
    columns = [replace(c, key=units.shown_name(c.key)) for c in columns]
    if fmt is Format.table:
        return _table(rows, columns, title, width)
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
    """Print the rows; text formats go out unwrapped (a pipe gets them verbatim), and so does a
    table (`piped`)."""
    whole = piped(console)
    rendered = render(rows, columns, fmt, title, None if whole else console.width)
    if not isinstance(rendered, Table):
        console.file.write(rendered)
        console.file.flush()
    elif whole:  # a console as wide as the table: rich never folds or crops a cell
        wide = Measurement.get(console, console.options.update_width(1_000_000), rendered)
        Console(file=console.file, width=wide.maximum, no_color=True).print(rendered)
    else:
        console.print(rendered)


def piped(console: Console) -> bool:
    """Whether `console` writes to another program or a file, with no width asked for
    (COLUMNS): its tables then keep every cell whole."""
    return not console.is_terminal and "COLUMNS" not in os.environ


# A table's width besides its cells': each column's border and padding, and the right edge;
# a compact table (no outer border, no padding at its edges) saves _COMPACT of it.
_PER_COLUMN, _EDGE, _COMPACT = 3, 1, 4


def _table(
    rows: Sequence[dict[str, Any]], columns: Sequence[Column], title: str | None, width: int | None
) -> Table:
    cells = [[cell(row.get(c.key), c.kind) for c in columns] for row in rows]
    if width is None:
        return _whole_table(cells, columns, title)
    texts = [[col.header, *(r[i] for r in cells)] for i, col in enumerate(columns)]
    natural = [max(map(len, column)) for column in texts]
    wrapping = [i for i, c in enumerate(columns) if not c.numeric]
    words = [max(len(w) for text in texts[i] for w in text.split()) for i in wrapping]
    # a number's column as wide as its header, or, when the labels need the room, as its cells
    # and its header's longest word (the header then wraps between words)
    whole = {i: natural[i] for i, c in enumerate(columns) if c.numeric}
    narrow = {i: max(len(w) for w in texts[i][0].split()) for i in whole}
    narrow = {i: max(narrow[i], *map(len, texts[i][1:])) for i in whole}
    room = width - _EDGE - _PER_COLUMN * len(columns)
    for saved, numbers in ((0, whole), (_COMPACT, whole), (_COMPACT, narrow)):
        # the compact table: the words fit in the outer border's and padding's space, or not
        fitted = _fit([natural[i] for i in wrapping], words, room + saved - sum(numbers.values()))
        if fitted is not None:
            break
    compact = saved > 0
    widths = dict(zip(wrapping, fitted, strict=True)) if fitted else {}
    table = Table(title=title, title_justify="left", show_edge=not compact, pad_edge=not compact)
    for i, col in enumerate(columns):
        if col.numeric and numbers[i] < whole[i]:  # every cell fits: only the header wraps
            table.add_column(col.header, justify="right", width=numbers[i])
        elif col.numeric:
            table.add_column(col.header, justify="right", no_wrap=True)
        else:  # folds mid-word only when the words themselves cannot fit
            table.add_column(col.header, overflow="fold", width=widths.get(i))
    for row in cells:
        table.add_row(*row)
    return table


def _whole_table(cells: list[list[str]], columns: Sequence[Column], title: str | None) -> Table:
    table = Table(title=title, title_justify="left")
    for col in columns:
        table.add_column(col.header, justify="right" if col.numeric else "left", no_wrap=True)
    for row in cells:
        table.add_row(*row)
    return table


def _fit(natural: list[int], words: list[int], budget: int) -> list[int] | None:
    """Widths of the text columns within `budget`, narrowing the widest first but none below
    its longest word; None when their words alone do not fit."""
    widths = list(natural)
    while sum(widths) > budget:
        narrowable = [i for i, w in enumerate(widths) if w > words[i]]
        if not narrowable:
            return None
        widths[max(narrowable, key=widths.__getitem__)] -= 1
    return widths


def _markdown(rows: Sequence[dict[str, Any]], columns: Sequence[Column], title: str | None) -> str:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    lines = [f"**{title}**", ""] if title else []
    lines.append(line([c.header for c in columns]))
    lines.append("|" + "|".join("---:" if c.numeric else "---" for c in columns) + "|")
    lines += [line([cell(row.get(c.key), c.kind) for c in columns]) for row in rows]
    return "\n".join(lines) + "\n\n"
