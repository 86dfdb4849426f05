"""The documentation site as a reader sees it: tools/docs_check.py (`make docs-check`) finds a
paragraph cut off and markdown left unrendered in fixture pages, passes on the real site built
from docs/, and takes its screenshots with Chromium where there is one; the site's hooks, and
the home page, which opens as the README does."""

from __future__ import annotations

import importlib.util
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import REPO

CHECK = REPO / "tools" / "docs_check.py"


def _module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check(site: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECK), str(site), *args],
        capture_output=True,
        text=True,
        env=os.environ | env,
        timeout=300,
    )


def _page(folder: Path, name: str, article: str) -> None:
    """A page laid out as Material's: navigation around the article, which alone is read."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "<html><body><nav><p>**menu** `not read` \\ nor cut</p></nav>"
        f'<article class="md-content__inner md-typeset">{article}</article>'
        "<footer><p>Made with</p></footer></body></html>"
    )


GOOD = (
    "<h1>Title</h1><p>A sentence.</p><p>The commands:</p><pre><code>a \\| b **c**</code></pre>"
    "<p>Introduces a list</p><ul><li>an item without a full stop</li></ul>"
    "<p>Asks? <em>Exclaims!</em></p><p>Ends in brackets (see <a href='x'>there</a>.)</p>"
    '<p class="doc doc-class-bases">Bases: <code>Label</code></p>'
    "<p>Code <code>a|b</code> and <code>C:\\dir</code>, a table:</p>"
    '<div class="md-typeset__table"><table><tr><td>cell</td></tr></table></div>'
)


def test_the_check_passes_pages_that_read_right(tmp_path: Path):
    _page(tmp_path, "index.html", GOOD)
    _page(tmp_path, "sub/page/index.html", GOOD)
    done = _check(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "2 pages, no paragraph cut off, no markdown left unrendered" in done.stdout


def test_the_check_names_every_cut_off_paragraph_and_unrendered_escape(tmp_path: Path):
    _page(tmp_path, "index.html", GOOD)
    _page(
        tmp_path,
        "how-to/tune/index.html",
        "<p>the median is over the trials that ran all their</p>"
        "<div class='admonition'><p>Cut in a box</p></div>"
        "<table><tr><td><code>--jobs N \\| --ray</code></td></tr></table>"
        "<p>A **bold** word.</p><p>A `tick.</p><p>A [link](x.md).</p><p>A \\ stray.</p>",
    )
    done = _check(tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    page = "how-to/tune/index.html"
    assert done.stderr.splitlines() == [
        f'{page}: a paragraph stops mid-sentence: "...the median is over the trials that ran all '
        'their"',
        f'{page}: a paragraph stops mid-sentence: "...Cut in a box"',
        f"{page}: unrendered markdown '**' in the text: \"A **bold** word.\"",
        f"{page}: unrendered markdown '`' in the text: \"A `tick.\"",
        f"{page}: unrendered markdown '](' in the text: \"A [link](x.md).\"",
        f"{page}: unrendered markdown '\\\\' in the text: \"A \\ stray.\"",
        f'{page}: an escaped pipe shown in a code span: "--jobs N \\| --ray"',
        "docs-check: 7 problems in 2 pages",
    ]


def test_an_empty_site_is_refused_in_one_line(tmp_path: Path):
    done = _check(tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        f"docs-check: no HTML page in {tmp_path}; build the site first (make docs)"
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real site, built from docs/ as `make docs` builds it (a few seconds)."""
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=os.environ | {"NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    return out


@pytest.mark.slow
def test_the_built_site_passes_the_check(site: Path):
    done = _check(site)
    assert done.returncode == 0, done.stderr
    cli = (site / "reference/cli/index.html").read_text()
    assert "<code>[--jobs N | --ray [HOST:PORT]]</code>" in cli  # docs/hooks/table_pipes.py
    plugin = (site / "reference/plugin-api/index.html").read_text()
    assert '<pre class="module-docstring">' in plugin  # docs/hooks/module_docstring.py


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("chromium") is None, reason="no chromium (apt-get install chromium)"
)
def test_chromium_screenshots_the_three_pages(site: Path, tmp_path: Path):
    done = _check(site, "--screenshots", str(tmp_path))
    assert done.returncode == 0, done.stderr
    for name in ("home", "cli", "plugin-api"):
        png = (tmp_path / f"{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", png[16:24]) == (1280, 2400)  # IHDR: the window's size


def test_without_chromium_the_screenshots_are_skipped_saying_so(tmp_path: Path):
    _page(tmp_path / "site", "index.html", GOOD)
    done = _check(tmp_path / "site", "--screenshots", str(tmp_path / "png"), PATH="/nonexistent")
    assert done.returncode == 0, done.stderr
    assert "docs-check: screenshots skipped: no chromium on PATH" in done.stdout
    assert not (tmp_path / "png").exists()


def test_a_pipe_in_a_table_code_span_loses_its_backslash_only_there():
    hook = _module(REPO / "docs" / "hooks" / "table_pipes.py")
    page = "| `a \\| b` | x \\| y `c \\| d` |\ntext `e \\| f`\n```text\n| `g \\| h` |\n```\n"
    assert hook.on_page_markdown(page) == (
        "| `a | b` | x \\| y `c | d` |\ntext `e \\| f`\n```text\n| `g \\| h` |\n```\n"
    )


def test_a_docstring_shown_on_the_site_keeps_its_indentation_and_sentences():
    hook = _module(REPO / "docs" / "hooks" / "module_docstring.py")
    text = (
        "Title line.\n\nSection\n    Name\n        What it is, in\n        two lines.\n"
        "        Another sentence.\n    Other\n        <b>"
    )
    assert hook.paragraphs(text) == [
        (0, "Title line."),
        (0, ""),
        (0, "Section"),
        (4, "Name"),
        (8, "What it is, in two lines."),
        (8, "Another sentence."),
        (4, "Other"),
        (8, "<b>"),
    ]
    assert '<span style="--indent: 8">&lt;b&gt;\n</span>' in hook.as_html(text)


def _opening(page: Path) -> str:
    text = page.read_text()
    return text[: text.index("\n## ")]


def test_the_home_page_opens_as_the_readme_does():
    """Every method and baseline the README lists, in the same words."""
    assert _opening(REPO / "docs" / "index.md") == _opening(REPO / "README.md")
