"""The tutorial (docs/tutorial/first-experiment.md) works as written: its commands, run through
the installed CLI (from the root of a copy of the repository, the folder a reader is likeliest in:
it needs none of its files), succeed, make what the text says they make, and change no
committed file."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from conftest import REPO, CliResult, CliRunner, cli_env
from test_docs_code import copy_of_the_repository, stray_changes

HEREDOC = re.compile(r"^cat > (\S+) <<'EOF'$")
NOT_RUN = {"tensorboard"}  # a server that runs until stopped
TUTORIAL = "docs/tutorial/first-experiment.md"


def tutorial_lines() -> list[str]:
    text = (REPO / TUTORIAL).read_text()
    section = text.split("<!-- tutorial:start -->")[1].split("<!-- tutorial:end -->")[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def run_tutorial(fedhet: CliRunner, folder: Path) -> list[tuple[str, CliResult]]:
    """(command line, result) of each fedhet command in turn; `cat > F <<'EOF'` writes F."""
    env = cli_env()
    env.pop("FEDHET_STORE", None)
    has_export = fedhet("export", "--help", env=env).rc == 0
    results, lines = [], iter(tutorial_lines())
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
        program, *args = shlex.split(line, comments=True)
        if program in NOT_RUN or (args[0] == "export" and not has_export):
            continue
        assert program == "fedhet", f"the tutorial runs only fedhet commands: {line}"
        result = fedhet(*args, env=env, cwd=folder)
        assert result.rc == 0, f"{line}\n{result.stderr}"
        results.append((line.split("#")[0].strip(), result))
    return results


def test_the_tutorial_runs_as_written(fedhet: CliRunner, tmp_path: Path):
    folder = copy_of_the_repository(tmp_path / "repository")
    ran = run_tutorial(fedhet, folder)
    results = dict(ran)
    assert "skew.yaml: valid (6 runs)" in results["fedhet spec validate skew.yaml"].stdout
    plans = [result.stdout for line, result in ran if line == "fedhet plan skew.yaml"]
    assert "8 stages: 8 missing; no time estimate" in plans[0]
    assert "8 stages: 4 stored, 4 missing; about" in plans[1]  # from the seed-0 runs
    runs = results["fedhet runs skew.yaml"].stdout
    assert runs.count("stored") == 6 and "missing" not in runs
    what_if = results["fedhet plan skew.yaml federation.lr=0.1"].stdout
    assert "2 stored, 6 missing; about" in what_if  # partitions reused, estimates from lr 0.05
    assert (folder / "report" / "skew.md").read_text().startswith("#")
    assert (folder / "report" / "skew.png").read_bytes()[:4] == b"\x89PNG"
    # only the named file: a panel per seed's partition
    assert [p.name for p in (folder / "report").glob("clients*.png")] == ["clients.png"]
    if "fedhet export skew.yaml --format csv --out report/skew.csv" in results:
        rows = (folder / "report" / "skew.csv").read_text().count("\n")
        assert rows == 1 + 6 * 6  # a header, then runs x rounds
        assert any((folder / "report" / "tb").rglob("*tfevents*"))
    assert stray_changes(folder) == []
