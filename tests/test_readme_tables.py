"""The documentation's result tables (docs/results/) are written from the committed reports
(`make readme`), never typed by hand: the committed pages must equal what the generator writes,
and the generator reads a report's tables, recomputes verdicts with the current floor and names
the machine."""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO

from fedhet.core.errors import InputError
from fedhet.reports.readme import documentation_pages, write_pages

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

## Has fedavg levelled off?

| algorithm | setting | rounds compared | runs | mean rise (points) | 95% CI | per run | verdict |
|---|---|---|---|---|---|---|---|
| fedavg | iid | 16-22 vs 23-30 | 3 | +0.20 | [-0.50, +0.90] | -0.30 to +0.60 | levelled off |
| fedavg | skew | 16-22 vs 23-30 | 3 | +4.00 | [+2.00, +6.00] | +3.00 to +5.00 | still rising |
| mine | iid | 16-22 vs 23-30 | 3 | +3.00 | [+2.00, +4.00] | +2.00 to +4.00 | still rising |
"""  # noqa: E501


def test_the_committed_pages_are_what_the_generator_writes(tmp_path):
    pages = documentation_pages(REPO)
    copies = []
    for page in pages:
        copy = tmp_path / page.relative_to(REPO)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(page.read_text())
        copies.append(copy)
    written = write_pages(copies, REPO / "reports" / "readme.yaml")
    # the results tables live on the results pages
    assert {p.relative_to(tmp_path).as_posix() for p in written.values()} == {
        "docs/results/baselines.md",
        "docs/results/index.md",
        "docs/results/papers.md",
    }
    for page, copy in zip(pages, copies, strict=True):
        assert copy.read_text() == page.read_text(), f"{page.relative_to(REPO)}: run `make readme`"


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
    # the blocks spread over two pages, in any order
    first, second = tmp_path / "a.md", tmp_path / "b.md"
    first.write_text(
        "".join(f"<!-- generated:{n} -->\nold\n<!-- end:{n} -->\n" for n in ["claims"])
    )
    second.write_text(
        "`<!-- generated:NAME -->` shown inline is no block\n"
        + "".join(f"<!-- generated:{n} -->\nold\n<!-- end:{n} -->\n" for n in ["pairs", "cells"])
    )
    written = write_pages([first, second], tmp_path / "readme.yaml")
    assert written == {"claims": first, "pairs": second, "cells": second}
    text = first.read_text() + second.read_text()
    assert "| toy | 80.40 ± 1.00 / 66.00 ± 2.00 |" in text
    # the report said "ahead" for +0.40; under the half-point floor it is negligible; in iid the
    # baseline has levelled off but mine is still rising: the difference may still change
    assert (
        "| mine | +0.40 [+0.22, +0.58] negligible (early training) | +6.00 [+4.00, +8.00] ahead |"
        in text
    )
    # the baseline is still rising in skew: the whole column says so
    assert "| method | iid | skew (early training) |" in text
    assert "| 3/3 | ahead (early training) |" in text
    assert "| mine > fedavg (`toy`, skew) | - | +6.00 | [+4.00, +8.00] | 3/3 | ahead" in text
    assert "| fedavg > mine (`toy`, skew) | - | -6.00 | [-8.00, -4.00] | 0/3 | behind" in text
    assert "(plateau not tested)" not in text
    machine = "`toy` on torch 2.14.1+cpu, threads 1, cpu AVX2, platform Linux-6.1-x86_64."
    assert machine in text
    assert "old" not in text


def test_a_block_without_a_page_or_an_entry_is_named(tmp_path):
    (tmp_path / "readme.yaml").write_text(yaml.safe_dump({"x": {"kind": "table", "report": "a"}}))
    page = tmp_path / "page.md"
    page.write_text("no blocks here\n")
    with pytest.raises(InputError, match="no page has a block <!-- generated:x -->"):
        write_pages([page], tmp_path / "readme.yaml")
    page.write_text("<!-- generated:x -->\n<!-- end:x -->\n<!-- generated:y -->\n<!-- end:y -->\n")
    with pytest.raises(InputError, match="block <!-- generated:y --> has no entry"):
        write_pages([page], tmp_path / "readme.yaml")
    other = tmp_path / "other.md"
    other.write_text("<!-- generated:x -->\n<!-- end:x -->\n")
    page.write_text("<!-- generated:x -->\n<!-- end:x -->\n")
    with pytest.raises(InputError, match="block x is generated twice"):
        write_pages([page, other], tmp_path / "readme.yaml")


def test_a_report_that_never_tested_the_plateau_says_so(tmp_path):
    untested = REPORT[: REPORT.index("## Has fedavg")]
    (tmp_path / "toy.md").write_text(untested)
    claim = {"claim": "mine > fedavg", "report": "toy", "algorithm": "mine", "setting": "iid"}
    config = {"claims": {"kind": "claims", "claims": [claim]}}
    (tmp_path / "readme.yaml").write_text(yaml.safe_dump(config))
    page = tmp_path / "a.md"
    page.write_text("<!-- generated:claims -->\n<!-- end:claims -->\n")
    write_pages([page], tmp_path / "readme.yaml")
    assert "| 3/3 | negligible (plateau not tested) |" in page.read_text()
