"""A sample of the committed reports' runs, recomputed from today's code, gives the numbers the
reports print: the code that moved since (the spec and CLI packages, the client context, the
store) changed no result. Each sampled cell of reports/quickstart.md (one seed per cell) is
trained from its spec without the matrix, in a fresh store. The bits depend on the instruction
set torch's kernels use (docs/results/index.md; the vendor's BLAS paths may matter too): on a
machine whose set is not the report's, the cells are compared with those fce7e75's code gave on
the machine named with them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml

import fedhet
from fedhet.reports.readme import read_report

ROOT = Path(__file__).resolve().parents[1]

SAMPLE = [  # (algorithm, partition as the matrix lists it, the report's column)
    ({"name": "fedavg"}, {"scheme": "classes", "clients": 10, "classes_per_client": 2}, "#C=2"),
    ({"name": "scaffold"}, {"scheme": "dirichlet", "clients": 10, "alpha": 0.1}, "alpha=0.1"),
]
CAPABILITY = torch.backends.cpu.get_cpu_capability()
# the sampled cells (best test accuracy, rounds to 85%) under an instruction set other than the
# report's, from fce7e75's code with the same torch and one thread (on an AMD EPYC, 2026-11-28;
# another vendor's CPU of the same set may differ: record it beside these)
OTHER_SETS = {
    "AVX2": {
        "fedavg": ("76.88 (n=1)", "never (0/1)"),
        "scaffold": ("90.81 (n=1)", "18.0 (1/1)"),
    },
}


def expected_cells(algorithm: str, column: str) -> tuple[str, str]:
    """The sampled cell's best accuracy and rounds to 85%, as this machine should compute them."""
    (environment,) = read_report(ROOT / "reports" / "quickstart.md").environments
    if f"torch {torch.__version__}," not in environment:
        pytest.skip(f"reports/quickstart.md is of another torch than {torch.__version__}")
    if f"cpu {CAPABILITY};" in environment:
        return (
            committed_cell("quickstart.md", None, algorithm, column),
            committed_cell("quickstart.md", "Rounds to 85.00%", algorithm, column),
        )
    if CAPABILITY not in OTHER_SETS:
        pytest.skip(f"no cells recorded for CPU capability {CAPABILITY}")
    return OTHER_SETS[CAPABILITY][algorithm]


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
    best, rounds = expected_cells(algorithm["name"], column)  # or a skip, before training
    spec = yaml.safe_load((ROOT / "specs" / "quickstart.yaml").read_text())
    spec.pop("matrix")
    spec |= {"algorithm": algorithm, "partition": partition}
    experiment = fedhet.load(spec, store=tmp_path / "store")
    experiment.train(jobs=1)
    run = experiment.runs().iloc[0]
    assert f"{run['best_test_pct']:.2f} (n=1)" == best
    target = experiment.metrics().query("test_accuracy_pct >= 85")["round"]
    shown = "never (0/1)" if target.empty else f"{float(target.min()):.1f} (1/1)"
    assert shown == rounds
    assert re.fullmatch(r"[0-9a-f]{64}", run["key"])
