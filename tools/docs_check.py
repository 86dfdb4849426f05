"""The built documentation site, checked as a reader sees it (`make docs-check`).

    python tools/docs_check.py SITE [--screenshots DIR]

Reads the article of every page of SITE (mkdocs' output, build/site) with the standard library's
HTML parser and reports, a line each, then exits 1:
- a paragraph cut off: a paragraph of markdown (a generated label, mkdocstrings' "Bases: X",
  has a class) whose text ends in no full stop, question or exclamation mark, and no colon
  or code block, list or table follows it;
- markdown left unrendered in the text a reader sees: a backslash, `**`, `__`, a backtick or
  `](` outside code, and `\\|` in a code span (GitHub's tables need the escape and drop the
  backslash; Python-Markdown's keep it, docs/hooks/table_pipes.py removes it).
With --screenshots, a headless Chromium (Debian's `chromium`) takes a PNG of the home, command
line and plug-in API pages into DIR, to look at; without Chromium it says so and skips them.
Standard library only: it runs in any Python, apart from fedhet.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

# what may end a paragraph (before closing brackets and quotes), and what it may introduce
SENTENCE_END = (".", "!", "?", ":")
CLOSERS = ")]}\"'\u2019\u201d"
INTRODUCED = {"pre", "ul", "ol", "dl", "table"}
# Material's wrappers: of a highlighted code block, of a table (not an admonition's box)
INTRODUCED_DIVS = {"highlight", "md-typeset__scrollwrap", "md-typeset__table"}
UNRENDERED = re.compile(r"\\|\*\*|__|`|\]\(")
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}
CODE = {"code", "pre", "kbd", "samp", "script", "style", "svg", "math"}
SCREENSHOTS = {
    "home": "index.html",
    "cli": "reference/cli/index.html",
    "plugin-api": "reference/plugin-api/index.html",
}
WINDOW = "1280,2400"  # a desktop's width (both sidebars shown), the first screens of a page


@dataclass
class Paragraph:
    text: str
    followed_by: str = ""  # the tag that opens right after it (a div: by its class), if any


@dataclass
class Article(HTMLParser):
    """The text of a Material page's article: its paragraphs, prose and inline code."""

    paragraphs: list[Paragraph] = field(default_factory=list)
    prose: list[str] = field(default_factory=list)
    inline_code: list[str] = field(default_factory=list)
    open_tags: list[str] = field(default_factory=list)  # inside the article, outermost first
    in_paragraph: list[str] | None = None

    def __post_init__(self) -> None:
        super().__init__(convert_charrefs=True)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = (dict(attrs).get("class") or "").split()
        if not self.open_tags and not (tag == "article" and "md-content__inner" in classes):
            return
        if self.paragraphs and self.paragraphs[-1].followed_by == "":
            introduced = tag == "div" and not INTRODUCED_DIVS.isdisjoint(classes)
            self.paragraphs[-1].followed_by = "pre" if introduced else tag
        if tag == "p" and self.in_paragraph is None and not classes:
            self.in_paragraph = []  # written in markdown: a class marks a label (mkdocstrings')
        if tag not in VOID:
            self.open_tags.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag not in self.open_tags:
            return
        while self.open_tags and self.open_tags.pop() != tag:
            pass  # an element left open inside it
        if tag == "p" and self.in_paragraph is not None:
            self.paragraphs.append(Paragraph(" ".join("".join(self.in_paragraph).split())))
            self.in_paragraph = None
        elif self.paragraphs and self.paragraphs[-1].followed_by == "":
            self.paragraphs[-1].followed_by = f"/{tag}"  # the paragraph ended its parent

    def handle_data(self, data: str) -> None:
        if not self.open_tags:
            return
        if self.in_paragraph is not None:
            self.in_paragraph.append(data)
        inside = set(self.open_tags)
        if "code" in inside and "pre" not in inside:
            self.inline_code.append(data)
        elif inside.isdisjoint(CODE):
            self.prose.append(data)


def read(page: Path) -> Article:
    article = Article()
    article.feed(page.read_text(encoding="utf-8"))
    article.close()
    return article


def cut_off(paragraph: Paragraph) -> bool:
    ends = paragraph.text.rstrip(CLOSERS + " ")
    return (
        bool(ends) and not ends.endswith(SENTENCE_END) and paragraph.followed_by not in INTRODUCED
    )


def problems_of(page: Path, name: str) -> list[str]:
    article = read(page)
    found = [
        f'{name}: a paragraph stops mid-sentence: "...{p.text[-70:]}"'
        for p in article.paragraphs
        if cut_off(p)
    ]
    for text in article.prose:
        firsts = {}  # each kind of mark once per text, where it first shows
        for match in UNRENDERED.finditer(text):
            firsts.setdefault(match.group(), match)
        for mark, match in firsts.items():
            context = text[max(0, match.start() - 40) : match.end() + 40].strip()
            found.append(f'{name}: unrendered markdown {mark!r} in the text: "{context}"')
    for code in article.inline_code:
        if "\\|" in code:
            found.append(f'{name}: an escaped pipe shown in a code span: "{code}"')
    return found


def check_site(site: Path) -> tuple[int, list[str]]:
    """The number of pages read and every problem found, a line each."""
    pages = sorted(site.rglob("*.html"))
    if not pages:
        raise SystemExit(f"docs-check: no HTML page in {site}; build the site first (make docs)")
    problems = [line for page in pages for line in problems_of(page, str(page.relative_to(site)))]
    return len(pages), problems


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def screenshot(site: Path, out: Path, browser: str) -> list[str]:
    """A PNG per page of SCREENSHOTS into OUT; the problems (a page missing, Chromium failing)."""
    out.mkdir(parents=True, exist_ok=True)
    problems = []
    for name, page in SCREENSHOTS.items():
        source, png = site / page, out / f"{name}.png"
        if not source.is_file():
            problems.append(f"{page}: no such page in {site} to screenshot")
            continue
        png.unlink(missing_ok=True)
        command = [
            browser,
            "--headless",
            "--no-sandbox",  # root in a container has no sandbox; the pages are our own files
            "--disable-gpu",  # scrollbars shown: a code block wider than the page has one
            f"--window-size={WINDOW}",
            f"--screenshot={png}",
            source.resolve().as_uri(),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0 or not png.is_file():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            problems.append(f"{page}: chromium took no screenshot (exit {done.returncode}: {last})")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path, help="the built site (build/site)")
    parser.add_argument("--screenshots", type=Path, metavar="DIR", help="PNGs of pages into DIR")
    args = parser.parse_args(argv)
    pages, problems = check_site(args.site)
    if args.screenshots:
        browser = chromium()
        if browser is None:
            print(
                "docs-check: screenshots skipped: no chromium on PATH "
                "(Debian: apt-get install chromium)"
            )
        else:
            problems += screenshot(args.site, args.screenshots, browser)
            if not problems:
                names = ", ".join(f"{name}.png" for name in SCREENSHOTS)
                print(f"docs-check: {names} in {args.screenshots}: look at them")
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        print(f"docs-check: {len(problems)} problems in {pages} pages", file=sys.stderr)
        return 1
    print(f"docs-check: {pages} pages, no paragraph cut off, no markdown left unrendered")
    return 0


if __name__ == "__main__":
    sys.exit(main())
