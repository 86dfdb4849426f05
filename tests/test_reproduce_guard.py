"""`make reproduce` refuses a tree with uncommitted changes (a committed report names the commit
it was computed from), except in reports/ (which it writes) or with ALLOW_DIRTY=1."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _make(clone: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-s", "clean-tree", *args], cwd=clone, capture_output=True, text=True
    )


@pytest.fixture
def clone(tmp_path):
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout")
    target = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--local", str(REPO), str(target)], check=True)
    return target


def test_uncommitted_code_is_refused_unless_allowed(clone):
    assert _make(clone).returncode == 0
    (clone / "Makefile").write_text((clone / "Makefile").read_text() + "\n# edited\n")
    refused = _make(clone)
    assert refused.returncode != 0
    assert "uncommitted changes; commit them first" in refused.stderr
    assert _make(clone, "ALLOW_DIRTY=1").returncode == 0


def test_reports_written_by_reproduce_do_not_count(clone):
    report = next((clone / "reports").glob("*.md"))
    report.write_text(report.read_text() + "\nregenerated\n")
    assert _make(clone).returncode == 0
