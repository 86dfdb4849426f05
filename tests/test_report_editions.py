"""Every committed report is of today's edition (issue 44): a figure in PNG, SVG and PDF, a
plateau section for every curve, and early-training marks that follow that section's rule (a
verdict is the plateau's only when both curves it compares have levelled off)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedhet.metrics.paired import TOO_FEW_SEEDS
from fedhet.reports.comparison import EARLY
from fedhet.reports.readme import read_report

REPORTS = Path(__file__).resolve().parents[1] / "reports"
PLATEAU = "## Has each curve levelled off?"

NAMES = sorted(p.stem for p in REPORTS.glob("*.md"))


def is_new_figure(name: str) -> bool:
    formats = all((REPORTS / f"{name}.{suffix}").is_file() for suffix in ("png", "svg", "pdf"))
    return formats and PLATEAU in (REPORTS / f"{name}.md").read_text()


def marks_follow_the_plateau(name: str) -> bool:
    """Every paired verdict carries the early-training mark exactly where one of its two curves
    has not levelled off by the report's own plateau table."""
    report = read_report(REPORTS / f"{name}.md")
    for rows in report.tables.values():
        header, *body = rows
        if header[:3] != ["algorithm", "setting", "pairs"]:
            continue
        for row in body:
            cells = dict(zip(header, row, strict=False))
            marked = cells["verdict"].endswith(EARLY)
            early = report.budget_note(row[1], row[0]) == "early training"
            if marked != (early and not cells["verdict"].startswith(TOO_FEW_SEEDS)):
                return False
    return True


@pytest.mark.parametrize("name", [n for n in NAMES if (REPORTS / f"{n}.png").is_file()])
def test_a_figure_is_of_todays_edition(name):
    assert is_new_figure(name), f"reports/{name}: regenerate it (PNG, SVG, PDF, plateau section)"


@pytest.mark.parametrize("name", NAMES)
def test_early_training_marks_follow_the_plateau(name):
    assert marks_follow_the_plateau(name), f"reports/{name}: a verdict's early mark is wrong"
