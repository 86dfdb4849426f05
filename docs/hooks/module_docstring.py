"""MkDocs hook: `<!-- module-docstring: fedhet.plugin -->` on a line of its own becomes that
module's docstring as a text block, verbatim (it is laid out for `help()`, not for Markdown).
The docstring is read from the source with `ast`, so the build imports nothing of fedhet."""

from __future__ import annotations

import ast
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


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return MARKER.sub(lambda m: f"```text\n{docstring(m.group(1))}\n```", markdown)
