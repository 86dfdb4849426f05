"""What a person reads: tables at 80 columns keep every label word whole, piped tables keep every
cell whole, `report` prints a summary naming its files, and a run whose output goes to a file
prints a line every few rounds instead of a progress bar."""

from __future__ import annotations

import math
import re

import pytest
from conftest import TINY_SPEC, cli_env, write_spec

from fedhet.core.spec import load_spec
from fedhet.core.store import ArtifactStore
from fedhet.engine.progress import LINES
from fedhet.execution.planning import runs_of
from fedhet.figures import FORMATS

LABELS = {
    **TINY_SPEC,
    "runtime": {"threads": 1, "progress": False},
    "matrix": {
        "algorithm": [{"name": "fedprox", "mu": 0.001}, {"name": "fedprox", "mu": 0.01}],
        "federation.lr": [0.05, 0.025],
        "federation.momentum": [0.0, 0.9],
        "partition.alpha": [0.5, 0.05],
    },
}


@pytest.mark.parametrize("width", [80, 70])  # at 70, the numbers' headers wrap for the labels
def test_tables_in_a_terminal_keep_label_words_whole(fedhet, tmp_path, width):
    spec = write_spec(tmp_path / "labels.yaml", LABELS)
    env = cli_env(tmp_path / "store", COLUMNS=str(width))
    for command in ("runs", "plan"):
        shown = fedhet(command, spec, env=env)
        assert shown.rc == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert max(map(len, lines)) <= width
        cells = [cell.strip() for line in lines for cell in re.split(r"[│┃]", line)]
        words = {word for cell in cells for word in cell.split()}
        for run in runs_of(load_spec(spec)):
            label = run.label if command == "plan" else f"{run.algorithm_label} {run.setting_label}"
            missing = set(label.split()) - words
            assert not missing, f"{command}: {missing} wrapped mid-word:\n{shown.stdout}"


def test_a_piped_table_keeps_every_cell_whole(fedhet, tmp_path):
    spec = write_spec(tmp_path / "labels.yaml", LABELS)
    shown = fedhet("runs", spec, env=cli_env(tmp_path / "store"))  # no COLUMNS: a pipe
    assert shown.rc == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert max(map(len, lines)) > 80  # wider than a terminal's default: nothing folded
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines if "│" in line]
    runs = runs_of(load_spec(spec))
    labels = [(run.algorithm_label, run.setting_label, str(run.spec.seed)) for run in runs]
    assert [tuple(row[:3]) for row in rows] == labels  # one line per run, each label whole
    assert (
        lines[0].strip() == "tiny-digits"
    )  # not "labels", the file: titled by the spec's name:, as reports are


def test_artifacts_show_piped_keeps_every_array_name_whole(fedhet, tmp_path):
    """`artifacts show` printed its arrays' table 80 columns wide into a pipe, cutting the names
    of a CNN's parameters (`model/best/features.conv1.0.wei…`)."""
    store = ArtifactStore(tmp_path / "store")
    name = "model/best/" + "features.block" * 6 + ".conv1.0.weight"
    with store.lock("train", "f" * 64), store.write("train", "f" * 64, {}) as group:
        group.create_array(name, shape=(16, 8, 3, 3), dtype="float32")
    shown = fedhet("artifacts", "show", "ffff", env=cli_env(tmp_path / "store"))
    assert shown.rc == 0, shown.stderr
    (row,) = [line for line in shown.stdout.splitlines() if "float32" in line]
    assert [cell.strip() for cell in row.split("│")[1:-1]] == [
        name,
        "(16, 8, 3, 3)",
        "(16, 8, 3, 3)",
        "float32",
    ]


def test_report_prints_a_summary_and_names_its_files(fedhet, tmp_path):
    raw = {**TINY_SPEC, "runtime": {"threads": 1, "progress": False}}
    spec = write_spec(tmp_path / "spec.yaml", raw)
    out = tmp_path / "out"
    shown = fedhet("report", spec, "--train", "--out", out, store=tmp_path / "store")
    assert shown.rc == 0, shown.stderr
    markdown = out / "tiny-digits.md"
    full = markdown.read_text()
    assert "## Per run" in full and "## Per run" not in shown.stdout
    assert len(shown.stdout.splitlines()) < 25 < len(full.splitlines())
    assert shown.stdout.startswith("# tiny-digits")
    assert f"The full report, {markdown}, also has: " in shown.stdout
    assert "Per run" in shown.stdout.splitlines()[-2]  # the rest's sections, by title
    for fmt in FORMATS:
        figure = markdown.with_suffix(f".{fmt}")
        assert figure.stat().st_size > 1000 and str(figure) in shown.stdout


def test_a_run_logging_to_a_file_prints_a_line_every_few_rounds(fedhet, tmp_path):
    rounds = 20
    raw = {
        **TINY_SPEC,
        "federation": {**TINY_SPEC["federation"], "rounds": rounds},
        "runtime": {"threads": 1, "progress": True},
    }
    spec = write_spec(tmp_path / "spec.yaml", raw)
    trained = fedhet("train", spec, store=tmp_path / "store")
    assert trained.rc == 0, trained.stderr
    (run,) = runs_of(load_spec(spec))
    pattern = (
        rf"{re.escape(run.label)}: round (\d+)/{rounds} acc \d+\.\d{{2}}% loss \d+\.\d{{4}}, \d+s"
    )
    found = [int(m.group(1)) for m in re.finditer(pattern, trained.stderr)]
    step = math.ceil(rounds / LINES)
    assert found == list(range(step, rounds + 1, step)), trained.stderr
    assert 10 <= len(found) <= 20


def test_the_cost_section_says_a_second_stage_holds_its_setup():
    from fedhet.reports.report import later_stage_setup

    rows = [{"algorithm": "TCT", "stage_starts": [20]}, {"algorithm": "FedAvg"}]
    assert "TCT's second stage also holds that stage's one-off setup" in later_stage_setup(rows)
    assert later_stage_setup(rows[1:]) == ""


def test_the_terminal_summary_names_the_personalized_figure(tmp_path):
    from fedhet.reports.report import summary

    md = tmp_path / "pfl.md"
    md.write_text("# pfl\n\ntable\n\n## Per run\n\ntext\n")
    (tmp_path / "pfl-personalized.png").write_bytes(b"png")  # an earlier report's: not this one's
    assert "pfl-personalized.png" not in summary(md)
    md.write_text("# pfl\n\n## Personalized\n\n![personalized accuracy](pfl-personalized.png)\n")
    assert summary(md).splitlines()[-1].endswith(f"{tmp_path / 'pfl-personalized.png'}")
