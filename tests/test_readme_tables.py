"""The README's result tables are written from the committed reports (`make readme`), never
typed by hand: the committed README must equal what the generator writes, and the generator
reads a report's tables, recomputes verdicts with the current floor and names the machine."""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO

from fedhet.core.errors import InputError
from fedhet.reports.readme import write_readme

REPORT = """# toy

- fedhet 0.1.0, abcdef1234567; torch 2.14.1+cpu, CUDA build none; cpu AVX2; threads 1; platform Linux-6.1-x86_64-with-glibc2.36 (x86_64): 6 runs

| algorithm | iid | skew |
|---|---|---|
| fedavg | 80.00 ± 1.00 (n=3) | 60.00 ± 2.00 (n=3) |
| mine | 80.40 ± 1.00 (n=3) | 66.00 ± 2.00 (n=3) |

## Paired differences against fedavg

### Best test accuracy (the papers' metric)

| algorithm | setting | pairs | mean difference (points) | 95% CI | seeds ahead | verdict | left out |
|---|---|---|---|---|---|---|---|
| mine | iid | 3 | +0.40 | [+0.22, +0.58] | 3/3 | ahead | - |
| mine | skew | 3 | +6.00 | [+4.00, +8.00] | 3/3 | ahead | - |
"""  # noqa: E501


def test_the_committed_readme_is_what_the_generator_writes(tmp_path):
    copy = tmp_path / "README.md"
    copy.write_text((REPO / "README.md").read_text())
    write_readme(copy, REPO / "reports" / "readme.yaml")
    assert copy.read_text() == (REPO / "README.md").read_text(), "run `make readme`"


def test_blocks_come_from_the_reports_with_the_floor_and_the_machine(tmp_path):
    (tmp_path / "toy.md").write_text(REPORT)
    config = {
        "cells": {"kind": "cells", "columns": ["spec", "mine"], "rows": [["toy", {
            "report": "toy", "algorithm": "mine", "settings": ["iid", "skew"]}]]},
        "pairs": {"kind": "paired", "report": "toy"},
        "claims": {"kind": "claims", "claims": [
            {"claim": "mine > fedavg", "report": "toy", "algorithm": "mine", "setting": "skew"},
            {"claim": "fedavg > mine", "report": "toy", "algorithm": "mine", "setting": "skew",
             "flip": True}]},
    }  # fmt: skip
    (tmp_path / "readme.yaml").write_text(yaml.safe_dump(config))
    readme = tmp_path / "README.md"
    readme.write_text("".join(f"<!-- generated:{n} -->\nold\n<!-- end:{n} -->\n" for n in config))
    write_readme(readme, tmp_path / "readme.yaml")
    text = readme.read_text()
    assert "| toy | 80.40 ± 1.00 / 66.00 ± 2.00 |" in text
    # the report said "ahead" for +0.40; under the half-point floor it is negligible
    assert "| mine | +0.40 [+0.22, +0.58] negligible | +6.00 [+4.00, +8.00] ahead |" in text
    assert "| mine > fedavg (`toy`, skew) | - | +6.00 | [+4.00, +8.00] | 3/3 | ahead |" in text
    assert "| fedavg > mine (`toy`, skew) | - | -6.00 | [-8.00, -4.00] | 0/3 | behind |" in text
    machine = "`toy` on torch 2.14.1+cpu, threads 1, cpu AVX2, platform Linux-6.1-x86_64."
    assert machine in text
    assert "old" not in text


def test_a_block_missing_from_the_readme_is_named(tmp_path):
    (tmp_path / "readme.yaml").write_text(yaml.safe_dump({"x": {"kind": "table", "report": "a"}}))
    (tmp_path / "README.md").write_text("no blocks here\n")
    with pytest.raises(InputError, match="no block <!-- generated:x -->"):
        write_readme(tmp_path / "README.md", tmp_path / "readme.yaml")
