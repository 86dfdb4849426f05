"""Every code block of the documentation (README.md and docs/**/*.md) runs in a test.

A fenced block runs by its language (a test each), from the root of a fresh copy of the
repository per page, which the page's blocks share in order; after each block, `git status` there
is clean: no change to a committed file and nothing new (the reader's own files that the pages
name, their spec and data, are in .gitignore; outputs go to the ignored report/).
By language:
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
  test names the page's path, which is checked here); a command or script block there runs in
  `copy_of_the_repository` too, and checks `stray_changes` as here;
- `<!-- docs-test: fragment [of specs/X.yaml] -->`: part of a spec, validated merged over the
  named spec (`base:`), or over a small digits spec;
- `<!-- docs-test: excerpt of PATH [why] -->`: quoted from PATH, a file that the tests run:
  every line of code in the block (a comment after two spaces aside) is a line of PATH.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
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
    if block.language == "bash":  # commands: run from a copy of the repository, checked there
        assert "stray_changes(" in test.read_text(), f"{block.argument}: check stray_changes"


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
    """A page -> its copy of the repository and the lines of its blocks run there so far."""
    return {}


def _git(folder: Path, *args: str) -> str:
    identity = ("-c", "user.name=docs-test", "-c", "user.email=docs-test@localhost")
    done = subprocess.run(["git", *identity, *args], cwd=folder, capture_output=True, check=True)
    return done.stdout.decode()


def copy_of_the_repository(folder: Path) -> Path:
    """The repository's files as they are now (tracked, and untracked but not ignored) in FOLDER,
    committed to a git repository of its own, whose `git status` is then empty; less the
    evidence bundles (tens of MB of stored runs that no page reads)."""
    names = _git(
        REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", ":!evidence"
    )
    for name in filter(None, names.split("\0")):
        source, target = REPO / name, folder / name
        if source.is_symlink() or source.exists():  # not a tracked file deleted in the worktree
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
    _git(folder, "init", "--quiet")
    _git(folder, "add", "--all")
    _git(folder, "commit", "--quiet", "--no-verify", "--no-gpg-sign", "--message", "the docs' copy")
    return folder


def stray_changes(folder: Path) -> list[str]:
    """The lines of `git status` in FOLDER: what a block changed or left that is not ignored."""
    return _git(folder, "status", "--porcelain", "--untracked-files=normal").splitlines()


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=_id)
def test_a_block_runs(
    block: Block,
    fedhet: CliRunner,
    folders: dict[Path, tuple[Path, set[int]]],
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
):
    if block.page not in folders:
        folders[block.page] = copy_of_the_repository(tmp_path_factory.mktemp("page")), set()
    folder, done = folders[block.page]
    # the page's blocks before this one first, when they have not run (this block alone, -k)
    page = [b for b in RUN_BLOCKS if b.page == block.page and b.line <= block.line]
    for earlier in page:
        if earlier.line not in done:
            _run(earlier, fedhet, folder, monkeypatch)
            done.add(earlier.line)
    stray = stray_changes(folder)
    assert not stray, (
        f"{block.where}, run from the repository's root, leaves `git status`: {'; '.join(stray)} "
        "(write outputs elsewhere than the committed files, e.g. `--out report`)"
    )


def _run(block: Block, fedhet: CliRunner, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = cli_env()
    env.pop("FEDHET_STORE", None)  # ./artifacts of the folder, as for a reader
    if block.language == "bash":
        _bash(block, fedhet, env, folder)
    elif block.language == "yaml":
        specs = folder.with_name(f"{folder.name}-specs")  # the test's own files, beside the copy
        specs.mkdir(exist_ok=True)
        spec = specs / f"block-{block.line}.yaml"
        spec.write_text(_spec_text(block, specs))
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


def _spec_text(block: Block, specs: Path) -> str:
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
        base = specs / "small.yaml"
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


def test_the_check_of_git_status_catches_what_a_block_writes_among_committed_files(
    fedhet: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    folder = copy_of_the_repository(tmp_path / "copy")
    code = (
        "from pathlib import Path\n"
        "Path('reports/quickstart.md').write_text('rewritten')\n"  # a committed report
        "Path('reports/mine.md').write_text('new')\n"  # new, inside a committed folder
        "Path('mine.csv').write_text('new')\n"  # the reader's own, ignored
        "Path('artifacts').mkdir()\n"  # ignored
        "Path('artifacts', 'x').write_text('new')\n"
        "Path('plot.png').write_text('new')\n"  # new, at the root
    )
    page = Block(REPO / "docs/example.md", 1, "python", code, "run", "")
    _run(page, fedhet, folder, monkeypatch)
    assert stray_changes(folder) == [
        " M reports/quickstart.md",
        "?? plot.png",
        "?? reports/mine.md",
    ]


# what a command or the API writes where the reader names it
OUTPUT = re.compile(
    r"--(?:out|plot|grid|tensorboard)[ =]['\"]?([^\s'\"]+)|\.report\(\s*(?:out=)?['\"]([^'\"]+)"
)


def test_no_block_names_an_output_among_the_committed_files():
    """Also the blocks another test runs (in a folder of its own, where reports/ is not the
    repository's): an output a block names is never inside a committed folder or file."""
    committed = {Path(name).parts[0] for name in _git(REPO, "ls-files").splitlines()}
    problems = [
        f"{block.where}: writes into {path}, which holds committed files; name another folder"
        for block in BLOCKS
        if block.mode != "skip"
        for match in OUTPUT.finditer(block.code)
        if Path(path := match.group(1) or match.group(2)).parts[0] in committed
    ]
    assert not problems, "\n".join(problems)
