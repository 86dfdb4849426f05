"""The documentation's result tables, written from the committed reports (`make readme`), so
that no number in them is typed by hand.

`reports/readme.yaml` names each generated block; one page of the documentation (README.md or
docs/**/*.md, the results pages today) holds it between `<!-- generated:NAME -->` and
`<!-- end:NAME -->`, and `write_pages` replaces what is between. Every block of the pages has
its entry and every entry its one block, so a table can move between pages without an edit here.
A block is one of:
- `table`: a report's main table (best test accuracy, mean ± std over seeds), as it is;
- `paired`: algorithms x settings of a report's paired table, each cell the mean difference,
  its interval and the verdict;
- `claims`: one row per claim, each naming its report, algorithm and setting, with the paper's
  figure as text;
- `cells`: rows of literal text and cells of reports' main tables (an algorithm in one or more
  settings, joined by " / ").
Every verdict of a `claims` block says where the two curves it compares stand (the report's
"Has ... levelled off?" section, in that setting): nothing when both have levelled off, else
"early training" (or "plateau not tested" for a report without the section or the rows); a
`paired` block says it of the baseline in each setting's column, and of a method in its cell
where the column does not already say early training; so no verdict reads as the plateau's when
the budget stopped before it.
Every block ends with the line naming the reports it came from, grouped by the machine their
runs were computed on (torch, threads, CPU instruction set where recorded, platform); each
report's header names the commits. Verdicts are
recomputed from the mean and interval with the current floor (fedhet.reports.comparison), so a
report written before the floor existed reads the same as a new one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedhet.core.errors import InputError
from fedhet.execution.labels import named_label
from fedhet.metrics.paired import TOO_FEW_SEEDS
from fedhet.reports.comparison import EARLY, FLOOR_POINTS
from fedhet.reports.plateau import moving

BEST = "Best test accuracy"
PAIRED_AGAINST = "Paired differences against "
PLATEAU = "levelled off"
EARLY_NOTE = "early training"


@dataclass(frozen=True, eq=False)
class Report:
    name: str
    environments: list[str]  # the header's "computed in" lines
    tables: dict[str, list[list[str]]]  # heading (the main table: "") -> rows of cells
    baseline: str | None = None  # what the paired differences are against

    def table(self, heading: str) -> list[list[str]]:
        """The table under the first heading that starts with `heading`."""
        for title, rows in self.tables.items():
            if title.startswith(heading):
                return rows
        raise InputError(f"reports/{self.name}.md has no table under a heading {heading!r}")

    def paired(self, algorithm: str, setting: str, metric: str = BEST) -> dict[str, str]:
        header, *rows = self.table(metric)
        algorithm = named_label(algorithm, [row[0] for row in rows]) or algorithm
        for row in rows:
            if row[:2] == [algorithm, setting]:
                return dict(zip(header, row, strict=False))
        raise InputError(
            f"reports/{self.name}.md: no paired row for {algorithm!r} in {setting!r} under "
            f"{metric!r}"
        )

    def budget_note(self, setting: str, algorithm: str | None = None) -> str:
        """Why a verdict in `setting` is not the plateau's: "early training" when the baseline's
        curve (or `algorithm`'s, the other of the pair) is still rising or falling there,
        "plateau not tested" when the report has no such section or row; empty when both have
        levelled off."""
        plateau = next((rows for h, rows in self.tables.items() if h.endswith(PLATEAU + "?")), [])
        if not plateau or self.baseline is None:
            return "plateau not tested"
        header, *rows = plateau
        labels = [row[0] for row in rows]
        verdicts = {tuple(row[:2]): dict(zip(header, row, strict=False))["verdict"] for row in rows}
        curves = [self.baseline] if algorithm is None else [self.baseline, algorithm]
        found = {verdicts.get((named_label(c, labels) or c, setting)) for c in curves}
        if any(moving(verdict) for verdict in found - {None}):
            return EARLY_NOTE
        return "" if found == {PLATEAU} else "plateau not tested"


def read_report(path: Path) -> Report:
    """A report's environments and tables, as `fedhet report` writes them."""
    if not path.is_file():
        raise InputError(f"{path}: report not found; run `make reproduce` (or report-NAME) first")
    lines = path.read_text().splitlines()
    environments = [line[2:] for line in lines if line.startswith("- fedhet ")]
    tables: dict[str, list[list[str]]] = {}
    heading, baseline = "", None
    for line in lines:
        if line.startswith("#") and not line.startswith("# "):
            heading = line.lstrip("#").strip()
            if heading.startswith(PAIRED_AGAINST):
                baseline = heading.removeprefix(PAIRED_AGAINST)
        elif line.startswith("|") and not set(line) <= set("|-"):
            tables.setdefault(heading, []).append([c.strip() for c in line.strip("|").split("|")])
    return Report(path.stem, environments, tables, baseline)


def _number(text: str) -> float:
    return float(text.replace("+", ""))


def verdict(mean: float, low: float, high: float, floor_points: float) -> str:
    if low <= 0 <= high:
        return "within noise"
    if abs(mean) < floor_points:
        return "negligible"
    return "ahead" if low > 0 else "behind"


def _interval(cells: dict[str, str]) -> tuple[float, float, float] | None:
    found = re.findall(r"[+-]?\d+\.\d+", cells.get("95% CI", ""))
    if len(found) != 2:
        return None
    return _number(cells["mean difference (points)"]), _number(found[0]), _number(found[1])


def _paired_text(cells: dict[str, str], flip: bool = False) -> tuple[str, str, str, str]:
    """(mean, interval, seeds ahead, verdict), the sign flipped for a reversed pairing."""
    measured = _interval(cells)
    if measured is None:
        verdict_alone = cells["verdict"].removesuffix(EARLY)  # marked here from the plateau
        return cells["mean difference (points)"], "-", cells["seeds ahead"], verdict_alone
    mean, low, high = measured
    if flip:
        mean, low, high = -mean, -high, -low
    ahead, n = (int(x) for x in cells["seeds ahead"].split("/"))
    if flip:
        ahead = n - ahead
    return (
        f"{mean:+.2f}",
        f"[{low:+.2f}, {high:+.2f}]",
        f"{ahead}/{n}",
        verdict(mean, low, high, FLOOR_POINTS),
    )


def _noted(text: str, note: str) -> str:
    """A verdict or a setting with its budget note: "ahead (early training)"."""
    return f"{text} ({note})" if note else text


def _markdown(rows: list[list[str]]) -> str:
    header, *body = rows
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in body)])


def _source(reports: list[Report]) -> str:
    """The line naming where a block's numbers come from: the reports, grouped by the machine
    their runs were computed on (each report's header names the commits)."""
    machines: dict[str, list[str]] = {}
    for report in reports:
        for machine in dict.fromkeys(_machine(env) for env in report.environments) or ["?"]:
            machines.setdefault(machine, []).append(f"`{report.name}`")
    on = "; ".join(f"{', '.join(names)} on {machine}" for machine, names in machines.items())
    return f"Generated by `make readme` from reports/: {on}."


def _machine(environment: str) -> str:
    """torch, threads, CPU instruction set and platform of an environment line."""
    fields = dict(_fields(environment))
    keep = ["torch", "threads", "cpu", "platform"]
    return ", ".join(f"{name} {fields[name]}" for name in keep if name in fields)


def _fields(environment: str) -> Iterator[tuple[str, str]]:
    environment = environment.rsplit(":", 1)[0]  # less ": N runs"
    for part in environment.split("; "):
        for name in ("cpu", "torch", "threads", "platform"):
            if part.startswith(name + " "):
                value = part[len(name) + 1 :]
                if name == "torch":
                    value = value.split(",")[0]
                if name == "platform":
                    value = value.split("-with-")[0]
                yield name, value


def table_block(report: Report, entry: dict[str, Any]) -> str:
    rows = report.table("")
    return _markdown(rows) + "\n\n" + _source([report])


def paired_block(report: Report, entry: dict[str, Any]) -> str:
    header, *rows = report.table(entry.get("metric", BEST))
    algorithms = entry.get("algorithms") or list(dict.fromkeys(row[0] for row in rows))
    settings = list(dict.fromkeys(row[1] for row in rows))
    names = entry.get("names", {})
    columns = {s: report.budget_note(s) for s in settings}  # the baseline's curve alone
    out = [["method", *[_noted(names.get(s, s), columns[s]) for s in settings]]]
    for algorithm in algorithms:
        cells = []
        for setting in settings:
            mean, interval, _, decided = _paired_text(
                report.paired(algorithm, setting, entry.get("metric", BEST))
            )
            if columns[setting] != EARLY_NOTE and decided != TOO_FEW_SEEDS:  # the method's curve
                decided = _noted(decided, report.budget_note(setting, algorithm))
            cells.append(f"{mean} {interval} {decided}")
        out.append([names.get(algorithm, algorithm), *cells])
    return _markdown(out) + "\n\n" + _source([report])


def claims_block(reports: dict[str, Report], entry: dict[str, Any]) -> str:
    out = [["claim (report, setting)", "paper (difference)", "ours: mean difference",
            "95% interval", "seeds ahead", "verdict"]]  # fmt: skip
    used = []
    for claim in entry["claims"]:
        report = reports[claim["report"]]
        used.append(report)
        cells = report.paired(claim["algorithm"], claim["setting"], claim.get("metric", BEST))
        mean, interval, ahead, decided = _paired_text(cells, claim.get("flip", False))
        label = f"{claim['claim']} (`{report.name}`, {claim.get('label', claim['setting'])})"
        if decided != TOO_FEW_SEEDS:
            decided = _noted(decided, report.budget_note(claim["setting"], claim["algorithm"]))
        out.append([label, claim.get("paper", "-"), mean, interval, ahead, decided])
    return _markdown(out) + "\n\n" + _source(list(dict.fromkeys(used)))


def cells_block(reports: dict[str, Report], entry: dict[str, Any]) -> str:
    out = [list(entry["columns"])]
    for row in entry["rows"]:
        out.append([_cell_text(reports, cell) for cell in row])
    used = [reports[name] for name in dict.fromkeys(_report_names(entry))]
    return _markdown(out) + "\n\n" + _source(used)


def _cell_text(reports: dict[str, Report], cell: Any) -> str:
    """A literal, or an algorithm's main-table cells in the settings named, without `(n=..)`."""
    if not isinstance(cell, dict):
        return str(cell)
    header, *rows = reports[cell["report"]].table("")
    # a label as the report writes it, or as reports wrote it before (readme.yaml reads both)
    algorithm = named_label(cell["algorithm"], [r[0] for r in rows])
    row = next((r for r in rows if r[0] == algorithm), None)
    if row is None:
        raise InputError(f"reports/{cell['report']}.md has no row {cell['algorithm']!r}")
    values = dict(zip(header, row, strict=False))
    texts = [values[s].split(" (n=")[0] for s in cell["settings"]]
    return cell.get("prefix", "") + " / ".join(texts) + cell.get("suffix", "")


def _report_names(entry: dict[str, Any]) -> Iterator[str]:
    if entry.get("kind") == "claims":
        yield from (claim["report"] for claim in entry["claims"])
    for row in entry.get("rows", []):
        yield from (cell["report"] for cell in row if isinstance(cell, dict))


def block(name: str, entry: dict[str, Any], folder: Path) -> str:
    kind = entry.get("kind")
    if kind in ("claims", "cells"):
        reports = {n: read_report(folder / f"{n}.md") for n in set(_report_names(entry))}
        return (claims_block if kind == "claims" else cells_block)(reports, entry)
    builders = {"table": table_block, "paired": paired_block}
    if kind not in builders:
        raise InputError(f"readme.yaml: {name}: kind must be table, paired, claims or cells")
    return builders[kind](read_report(folder / f"{entry['report']}.md"), entry)


# a block starts on a line of its own (a page may show the marker inline, in backticks)
GENERATED = re.compile(r"^<!-- generated:([\w.-]+) -->$", re.MULTILINE)


def documentation_pages(root: Path) -> list[Path]:
    """The pages that may hold generated blocks: the README and every page of docs/."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def write_pages(pages: list[Path], config: Path) -> dict[str, Path]:
    """Replace every generated block of `pages` from the reports next to `config`; each block's
    name -> the page it was written into. A page is rewritten only when a block of it changed."""
    entries = yaml.safe_load(config.read_text()) or {}
    texts = {page: page.read_text() for page in pages}
    where: dict[str, Path] = {}
    for page, text in texts.items():
        for name in GENERATED.findall(text):
            if name not in entries:
                raise InputError(
                    f"{page}: block <!-- generated:{name} --> has no entry in {config}"
                )
            if name in where:
                raise InputError(f"block {name} is generated twice: in {where[name]} and {page}")
            where[name] = page
    for name, entry in entries.items():
        if name not in where:
            raise InputError(
                f"no page has a block <!-- generated:{name} --> ... <!-- end:{name} --> for "
                f"{config.name}'s {name}"
            )
        page, start, end = where[name], f"<!-- generated:{name} -->", f"<!-- end:{name} -->"
        text = texts[page]
        opened = re.search(f"^{re.escape(start)}$", text, re.MULTILINE)
        assert opened is not None  # found above
        closed = re.compile(f"^{re.escape(end)}$", re.MULTILINE).search(text, opened.end())
        if closed is None:
            raise InputError(f"{page}: block {start} has no {end} on a line of its own")
        generated = block(name, entry, config.parent)
        texts[page] = f"{text[: opened.start()]}{start}\n{generated}\n{end}{text[closed.end() :]}"
    for page, text in texts.items():
        if text != page.read_text():
            page.write_text(text)
    return where


def main() -> None:
    try:
        written = write_pages(documentation_pages(Path(".")), Path("reports/readme.yaml"))
    except InputError as err:
        raise SystemExit(f"make readme: {err}") from None
    for page in dict.fromkeys(written.values()):
        names = [name for name, where in written.items() if where == page]
        print(f"{page}: {len(names)} generated blocks written ({', '.join(names)})")


if __name__ == "__main__":
    main()
