"""Where a report goes and what a missing run's message says.

`fedhet report` and `Experiment.report()` write into report/ of the working directory unless
told otherwise: never into reports/, the repository's committed results (which `make reproduce`
and `make readme` write, naming it). A run that is not stored is named with the way to store it in
the caller's words: the command line, overrides and all, with its --train; from Python, the
`fedhet.load(...)` call, overrides and all, and the reader's train=True."""

from __future__ import annotations

import re

import pytest
from conftest import REPO, TINY_SPEC, write_spec

from fedhet import load
from fedhet.core.errors import InputError

SPEC = {**TINY_SPEC, "runtime": {"threads": 1, "progress": False}}


def snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_report_without_out_leaves_a_reports_folder_alone(fedhet, tmp_path, monkeypatch):
    committed = tmp_path / "reports"
    committed.mkdir()
    (committed / "tiny-digits.md").write_text("a committed result\n")
    before = snapshot(committed)
    spec = write_spec(tmp_path / "tiny.yaml", SPEC)
    result = fedhet("report", spec, "--train", "--store", tmp_path / "store", cwd=tmp_path)
    assert result.rc == 0, result.stderr
    assert (tmp_path / "report" / "tiny-digits.md").exists()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "report" / "tiny-digits.md").unlink()
    written = load(spec, store=tmp_path / "store").report()
    assert written.resolve() == (tmp_path / "report" / "tiny-digits.md").resolve()
    assert snapshot(committed) == before


def test_the_help_example_writes_no_committed_reports(fedhet):
    shown = fedhet("report", "--help").stdout
    assert "fedhet report specs/quickstart.yaml" in shown and "--out reports" not in shown


def test_a_missing_run_from_python_names_the_load_call_and_train_true(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    experiment = load("specs/quickstart.yaml", "federation.rounds=3", store=tmp_path)
    call = f"fedhet.load('specs/quickstart.yaml', 'federation.rounds=3', store='{tmp_path}')"
    for reader in ("metrics", "compare", "report"):
        with pytest.raises(InputError) as raised:
            getattr(experiment, reader)()
        message = str(raised.value)
        assert f"call `{call}.train()` first or pass {reader}(train=True)" in message
        assert "--train" not in message and "fedhet train" not in message
    mapping = load({"name": "tiny", "data": {"dataset": "digits"}}, "seed=3", store=tmp_path)
    with pytest.raises(InputError, match=re.escape("`fedhet.load({...}, 'seed=3', store=")):
        mapping.metrics()


def test_a_missing_run_on_the_command_line_names_the_command_and_train(fedhet, tmp_path):
    result = fedhet("report", "specs/quickstart.yaml", "federation.rounds=3", store=tmp_path)
    assert result.rc == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.endswith(
        "run `fedhet train specs/quickstart.yaml federation.rounds=3` first or pass --train"
    )


def test_the_command_line_hint_keeps_an_explicit_store(fedhet, tmp_path):
    """Run as the hint says, the train stores where the refused command reads."""
    store = tmp_path / "elsewhere"
    result = fedhet("export", "specs/quickstart.yaml", "federation.rounds=3", "--store", store)
    assert result.rc == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    command = f"fedhet train specs/quickstart.yaml federation.rounds=3 --store {store}"
    assert line.endswith(f"run `{command}` first or pass --train")
