"""MkDocs hook: `<!-- module-docstring: fedhet.plugin -->` on a line of its own becomes that
module's docstring as a block of monospaced text, indented as in the source (it is laid out for
`help()`, not for Markdown). The source's lines are narrower than `help()`'s terminal but wider
than the page: a sentence's lines of one indentation are joined into one line that wraps under
its own indentation (docs/stylesheets/extra.css) rather than being clipped or broken twice.
The docstring is read from the source with `ast`, so the build imports nothing of fedhet."""

from __future__ import annotations

import ast
import html
import re
from pathlib import Path
from typing import Any

MARKER = re.compile(r"^<!-- module-docstring: ([\w.]+) -->$", re.MULTILINE)
ROOT = Path(__file__).resolve().parents[2]


def docstring(module: str) -> str:
    path = ROOT.joinpath(*module.split("."))
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    text = ast.get_docstring(ast.parse(source.read_text()))
    if not text:
        raise ValueError(f"{module} ({source}) has no docstring")
    return text


def paragraphs(text: str) -> list[tuple[int, str]]:
    """(indentation, text) of each run of lines indented alike up to a full stop, and of each
    blank line."""
    joined: list[tuple[int, str]] = []
    for line in text.splitlines():
        indent, words = len(line) - len(line.lstrip()), line.strip()
        before = joined[-1] if joined else (-1, "")
        if words and before[1] and before[0] == indent and not before[1].endswith("."):
            joined[-1] = (indent, f"{joined[-1][1]} {words}")
        else:
            joined.append((indent, words))
    return joined


def as_html(text: str) -> str:
    """A `<pre>` with no blank line (one would end the HTML block), a span per paragraph."""
    spans = "".join(
        f'<span style="--indent: {indent}">{html.escape(words)}\n</span>'
        for indent, words in paragraphs(text)
    )
    return f'<pre class="module-docstring"><code>{spans}</code></pre>'


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return MARKER.sub(lambda m: as_html(docstring(m.group(1))), markdown)
