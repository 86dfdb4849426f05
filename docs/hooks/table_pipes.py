r"""MkDocs hook: in a table row, `\|` inside a code span becomes `|`.

GitHub's tables need the escape for a pipe inside a code span, and drop its backslash;
Python-Markdown's tables never split a row inside a code span, and would show the backslash.
"""

from __future__ import annotations

import re
from typing import Any

CODE_SPAN = re.compile(r"`[^`\n]+`")


def _unescape(span: re.Match[str]) -> str:
    return span.group(0).replace("\\|", "|")


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    lines, fenced = markdown.split("\n"), False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        elif line.startswith("|") and not fenced:
            lines[i] = CODE_SPAN.sub(_unescape, line)
    return "\n".join(lines)
