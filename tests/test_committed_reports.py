"""A sample of the committed reports' runs, recomputed from today's code, gives the numbers the
reports print: the code that moved since (the spec and CLI packages, the client context, the
store) changed no result. Each sampled cell of reports/quickstart.md (one seed per cell) is
trained from its spec without the matrix, in a fresh store."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

import fedhet

ROOT = Path(__file__).resolve().parents[1]

SAMPLE = [  # (algorithm, partition as the matrix lists it, the report's column)
    ({"name": "fedavg"}, {"scheme": "classes", "clients": 10, "classes_per_client": 2}, "#C=2"),
    ({"name": "scaffold"}, {"scheme": "dirichlet", "clients": 10, "alpha": 0.1}, "alpha=0.1"),
]


def committed_cell(report: str, section: str | None, algorithm: str, column: str) -> str:
    """The cell of a committed report's table: the first table after the heading `section` (the
    first table of the file for None), the row whose label starts with the algorithm's name."""
    text = (ROOT / "reports" / report).read_text()
    if section is not None:
        text = text.split(f"## {section}", 1)[1]
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0].lower().startswith(algorithm):
            return cells[header.index(column)]
    raise AssertionError(f"{report}: no row for {algorithm}")


@pytest.mark.parametrize(("algorithm", "partition", "column"), SAMPLE)
def test_quickstart_cells_reproduce(tmp_path, algorithm, partition, column):
    spec = yaml.safe_load((ROOT / "specs" / "quickstart.yaml").read_text())
    spec.pop("matrix")
    spec |= {"algorithm": algorithm, "partition": partition}
    experiment = fedhet.load(spec, store=tmp_path / "store")
    experiment.train(jobs=1)
    run = experiment.runs().iloc[0]
    best = committed_cell("quickstart.md", None, algorithm["name"], column)
    assert f"{run['best_test_pct']:.2f} (n=1)" == best
    rounds = committed_cell("quickstart.md", "Rounds to 85.00%", algorithm["name"], column)
    target = experiment.metrics().query("test_accuracy_pct >= 85")["round"]
    shown = "never (0/1)" if target.empty else f"{float(target.min()):.1f} (1/1)"
    assert shown == rounds
    assert re.fullmatch(r"[0-9a-f]{64}", run["key"])
