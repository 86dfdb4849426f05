"""Every code block of the documentation (README.md and docs/**/*.md) runs in a test.

A fenced block runs by its language (a test each), in a fresh folder per page that the page's
blocks share in order (with `specs/` of the repository linked in, so a page's commands run as
from the root):
- `bash`: command by command; `cat > FILE <<'EOF'` ... `EOF` writes FILE, every other line is a
  `fedhet` command that must exit 0 (through the CLI fixture, as test_tutorial runs its lines);
- `yaml`: a spec, which `fedhet spec validate` must accept;
- `python`: run as a script in the folder (in the test's process: fedhet is imported once);
- `toml`: parsed;
- `text`: output or a layout, not code: not run.

The line before a block may instead say how it is checked, in an HTML comment (the site does
not show it):
- `<!-- docs-test: skip REASON -->`: not run, and reported as a skipped test with REASON (a
  block that takes hours, starts a server or changes the environment); no reason, no skip;
- `<!-- docs-test: by tests/test_X.py -->`: that test runs it, reading it from this page (the
  test names the page's path, which is checked here);
- `<!-- docs-test: fragment [of specs/X.yaml] -->`: part of a spec, validated merged over the
  named spec (`base:`), or over a small digits spec;
- `<!-- docs-test: excerpt of PATH [why] -->`: quoted from PATH, a file that the tests run:
  every line of code in the block (a comment after two spaces aside) is a line of PATH.
"""

from __future__ import annotations

import re
import shlex
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import REPO, CliRunner, cli_env

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"^<!-- docs-test: (skip|by|fragment|excerpt)\b\s*(.*?)\s*-->$")
HEREDOC = re.compile(r"^cat > (\S+) <<'EOF'$")
RUN = {"bash", "yaml", "python", "toml"}
NOT_CODE = {"text"}
# a fragment without `of`: merged over this
SMALL_SPEC = {
    "name": "fragment",
    "data": {"dataset": "digits"},
    "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.5},
    "model": {"arch": "mlp", "hidden": [16]},
    "federation": {"rounds": 2, "batch_size": 32, "lr": 0.05},
    "algorithm": {"name": "fedavg"},
    "runtime": {"threads": 1, "progress": False},
}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, from 1
    language: str
    code: str
    mode: str  # "run", or a marker's: skip, by, fragment, excerpt
    argument: str  # the marker's text after its mode

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            assert not lines[i].lstrip().startswith("```"), (
                f"{page.relative_to(REPO)}:{i + 1}: an indented fence; tests/test_docs_code.py "
                "reads fences at the start of a line only"
            )
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j] == "```"), None)
        assert end is not None, f"{page.relative_to(REPO)}:{i + 1}: a fence never closed"
        marker = MARKER.match(lines[i - 1]) if i else None
        mode, argument = (marker.group(1), marker.group(2)) if marker else ("run", "")
        code = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(Block(page, i + 1, opened.group(1), code, mode, argument))
        i = end + 1
    return found


BLOCKS = [block for page in PAGES for block in blocks(page)]


def of_mode(mode: str) -> list[Block]:
    return [block for block in BLOCKS if block.mode == mode]


def _id(block: Block) -> str:
    return block.where


def test_every_block_is_accounted_for():
    problems = []
    for block in BLOCKS:
        if block.language not in RUN | NOT_CODE:
            problems.append(f"{block.where}: give the block a language ({sorted(RUN | NOT_CODE)})")
        if block.language in NOT_CODE and block.mode != "run":
            problems.append(f"{block.where}: a {block.language} block is not code: no marker")
        if block.mode == "skip" and len(block.argument.split()) < 3:
            problems.append(f"{block.where}: a skipped block says why (`skip REASON`)")
        if block.mode == "fragment" and block.language != "yaml":
            problems.append(f"{block.where}: only a yaml block is a fragment")
    for page in PAGES:
        text = page.read_text()
        markers = len(re.findall(r"^<!-- docs-test:", text, re.MULTILINE))
        placed = sum(1 for block in BLOCKS if block.page == page and block.mode != "run")
        if markers != placed:
            problems.append(f"{page.relative_to(REPO)}: a docs-test marker not right above a fence")
    assert not problems, "\n".join(problems)
    assert len(BLOCKS) > 20 and of_mode("run")  # the pages are found and most blocks run


@pytest.mark.parametrize("block", of_mode("skip"), ids=_id)
def test_a_skipped_block_says_why(block: Block):
    pytest.skip(f"{block.where}: {block.argument}")


@pytest.mark.parametrize("block", of_mode("by"), ids=_id)
def test_a_block_run_by_another_test_is_read_from_its_page_there(block: Block):
    test = REPO / block.argument
    assert test.is_file() and test.parent.name == "tests", f"{block.where}: no test {test}"
    page = str(block.page.relative_to(REPO))
    assert page in test.read_text(), f"{block.argument} does not read {page}"


@pytest.mark.parametrize("block", of_mode("excerpt"), ids=_id)
def test_an_excerpt_is_the_code_it_quotes(block: Block):
    quoted = REPO / re.fullmatch(r"of (\S+).*", block.argument).group(1)
    assert quoted.is_file(), f"{block.where}: {quoted} does not exist"
    source = {_code(line) for line in quoted.read_text().splitlines()}
    for line in block.code.splitlines():
        code = _code(line)
        if code and code != "..." and not code.startswith("#"):
            assert code in source, f"{block.where}: not in {quoted.relative_to(REPO)}: {line}"


def _code(line: str) -> str:
    """A line without its indentation and a comment after two spaces."""
    return line.split("  # ")[0].strip()


RUN_BLOCKS = [b for b in BLOCKS if b.mode in ("run", "fragment") and b.language in RUN]


@pytest.fixture(scope="module")
def folders() -> dict[Path, tuple[Path, set[int]]]:
    """A page -> its folder and the lines of its blocks run there so far."""
    return {}


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=_id)
def test_a_block_runs(
    block: Block,
    fedhet: CliRunner,
    folders: dict[Path, tuple[Path, set[int]]],
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
):
    if block.page not in folders:
        folder = tmp_path_factory.mktemp("page")
        (folder / "specs").symlink_to(REPO / "specs")
        folders[block.page] = folder, set()
    folder, done = folders[block.page]
    # the page's blocks before this one first, when they have not run (this block alone, -k)
    for earlier in [b for b in RUN_BLOCKS if b.page == block.page and b.line <= block.line]:
        if earlier.line not in done:
            _run(earlier, fedhet, folder, monkeypatch)
            done.add(earlier.line)


def _run(block: Block, fedhet: CliRunner, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = cli_env()
    env.pop("FEDHET_STORE", None)  # ./artifacts of the folder, as for a reader
    if block.language == "bash":
        _bash(block, fedhet, env, folder)
    elif block.language == "yaml":
        spec = folder / f"block-{block.line}.yaml"
        spec.write_text(_spec_text(block, folder))
        result = fedhet("spec", "validate", spec, env=env, cwd=folder)
        assert result.rc == 0, f"{block.where}: {result.stdout}{result.stderr}"
    elif block.language == "python":
        with monkeypatch.context() as inside:  # as a script run in the folder
            inside.chdir(folder)
            inside.delenv("FEDHET_STORE", raising=False)
            inside.setattr(sys, "argv", [block.where])
            exec(compile(block.code, block.where, "exec"), {"__name__": "__main__"})
    else:
        tomllib.loads(block.code)


def _spec_text(block: Block, folder: Path) -> str:
    if block.mode == "run":
        return block.code
    fragment = yaml.safe_load(block.code)
    assert isinstance(fragment, dict), f"{block.where}: a fragment is a mapping"
    of = re.fullmatch(r"(?:of (\S+))?", block.argument)
    assert of, f"{block.where}: `fragment` or `fragment of specs/X.yaml`"
    if of.group(1):
        base = REPO / of.group(1)
        assert base.is_file(), f"{block.where}: {base} does not exist"
    else:
        base = folder / "small.yaml"
        base.write_text(yaml.safe_dump(SMALL_SPEC))
    return yaml.safe_dump({"base": str(base), **fragment})


def _bash(block: Block, fedhet: CliRunner, env: dict[str, str], folder: Path) -> None:
    lines = iter(block.code.splitlines())
    for line in lines:
        heredoc = HEREDOC.match(line)
        if heredoc:
            body = []
            for inner in lines:
                if inner == "EOF":
                    break
                body.append(inner)
            (folder / heredoc.group(1)).write_text("\n".join(body) + "\n")
            continue
        words = shlex.split(line, comments=True)
        if not words:
            continue
        program, *args = words
        assert program == "fedhet", (
            f"{block.where}: `{program}` is not a fedhet command; run it here, or mark the block "
            "`<!-- docs-test: skip REASON -->` or `by tests/...`"
        )
        result = fedhet(*args, env=env, cwd=folder)
        assert result.rc == 0, f"{block.where}: {line}\n{result.stdout}\n{result.stderr}"
