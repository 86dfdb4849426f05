"""Overrides win or refuse, never drop: an override of a swept field replaces its matrix axis
(said in one line), one matrix entry is addressed by its index, and `--only` keeps runs of the
full matrix with their keys. Through the installed command line, as a user types it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from conftest import REPO, CliRunner

from fedhet import api
from fedhet.cli.app import app

QUICKSTART = "specs/quickstart.yaml"


def keys(fedhet: CliRunner, *args: str) -> dict[str, list[str]]:
    """`fedhet spec hash`: run label -> its stage keys."""
    result = fedhet("spec", "hash", *args)
    assert result.rc == 0, result.stderr
    runs: dict[str, list[str]] = {}
    for line in result.stdout.splitlines():
        if line.startswith("# "):
            label = line[2:]
            runs[label] = []
        else:
            runs[label].append(line.split()[-1])
    return runs


def edited(tmp_path: Path, change) -> str:
    """The quickstart spec edited by `change(data)`, written to a file."""
    data = yaml.safe_load((REPO / QUICKSTART).read_text())
    change(data)
    path = tmp_path / "edited.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def one_line_refusal(result) -> str:
    assert result.rc == 2 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    return line


def test_overrides_of_swept_fields_replace_their_axes_and_say_so(fedhet: CliRunner, tmp_path):
    args = ["algorithm.name=fedprox", "algorithm.mu=0.1", "partition={scheme: iid, clients: 5}"]
    result = fedhet("spec", "validate", QUICKSTART, *args)
    assert result.rc == 0 and "valid (1 run)" in result.stdout, result.stderr
    notes = result.stderr.strip().splitlines()
    assert len(notes) == 2
    assert "replaces the matrix axis algorithm (5 values)" in notes[0]
    assert "replaces the matrix axis partition (2 values)" in notes[1]

    def as_edited(data):
        del data["matrix"]
        data["algorithm"] = {"name": "fedprox", "mu": 0.1}
        data["partition"] = {"scheme": "iid", "clients": 5}

    # exactly the keys of an edited file
    overridden = keys(fedhet, QUICKSTART, *args)
    assert list(overridden.values()) == list(keys(fedhet, edited(tmp_path, as_edited)).values())


def test_an_override_inside_a_swept_section_wins_or_is_refused_never_dropped(fedhet: CliRunner):
    # quickstart sweeps whole algorithm sections; its own algorithm is fedavg, which has no mu
    line = one_line_refusal(fedhet("spec", "validate", QUICKSTART, "algorithm.mu=0.1"))
    assert "algorithm.mu" in line and "override 'algorithm.mu=0.1'" in line


def test_one_matrix_entry_is_addressed_by_its_index(fedhet: CliRunner, tmp_path):
    full = keys(fedhet, QUICKSTART)
    changed = keys(fedhet, QUICKSTART, "matrix.algorithm.1.mu=0.1")

    def as_edited(data):
        data["matrix"]["algorithm"][1]["mu"] = 0.1

    assert changed == keys(fedhet, edited(tmp_path, as_edited))
    differs = [label for label in full if full.get(label) != changed.get(label)]
    assert differs and all(label.startswith("FedProx") for label in differs)
    assert len(changed) == len(full)
    line = one_line_refusal(fedhet("spec", "validate", QUICKSTART, "matrix.algorithm.7.mu=1"))
    assert "matrix.algorithm has 5 entries, indexed 0 to 4" in line
    line = one_line_refusal(fedhet("spec", "validate", QUICKSTART, "matrix.model.0.arch=mlp"))
    assert "the matrix has no axis model" in line


def test_only_keeps_runs_of_the_full_matrix_with_their_keys(fedhet: CliRunner):
    full = keys(fedhet, QUICKSTART)
    kept = keys(fedhet, QUICKSTART, "--only", "algorithm=fedprox", "--only", "partition=dirichlet")
    assert len(kept) == 1 and all(full[label] == k for label, k in kept.items())
    assert len(keys(fedhet, QUICKSTART, "--only", "algorithm=scaffold")) == 2
    line = one_line_refusal(fedhet("spec", "validate", QUICKSTART, "--only", "seed=3"))
    assert "seed is no matrix axis; the axes: algorithm, partition" in line
    line = one_line_refusal(fedhet("spec", "validate", QUICKSTART, "--only", "algorithm=fedbn"))
    assert "no value of matrix.algorithm matches" in line and "scaffold" in line


def test_only_filters_of_one_axis_add_up(fedhet: CliRunner):
    full = keys(fedhet, QUICKSTART)
    both = keys(fedhet, QUICKSTART, "--only", "algorithm=fedprox", "--only", "algorithm=scaffold")
    assert len(both) == 4 and all(full[label] == k for label, k in both.items())
    assert {label.split(",")[0] for label in both} == {"FedProx", "SCAFFOLD"}
    narrowed = keys(
        fedhet,
        QUICKSTART,
        "--only",
        "algorithm=fedprox",
        "--only",
        "algorithm=scaffold",
        "--only",
        "partition=dirichlet",
    )
    assert len(narrowed) == 2
    line = one_line_refusal(
        fedhet(
            "spec",
            "validate",
            QUICKSTART,
            "--only",
            "algorithm=fedavg",
            "--only",
            "algorithm=fedbn",
        )
    )
    assert "--only 'algorithm=fedbn': no value of matrix.algorithm matches" in line


def test_the_python_api_follows_the_same_rule():
    experiment = api.load(REPO / QUICKSTART, "algorithm.name=scaffold")
    assert {run.algorithm_label for run in experiment.planned} == {"SCAFFOLD"}
    assert len(experiment.planned) == 2


def help_examples() -> list[list[str]]:
    """Every example line of every command's --help, as its arguments."""
    commands = [c for group in (app, *[g.typer_instance for g in app.registered_groups])
                for c in group.registered_commands]  # fmt: skip
    lines = [c.epilog or "" for c in commands]
    found = re.findall(r"\$ fedhet (.+)", "\n".join(lines))
    return [shlex.split(example) for example in found]


@pytest.mark.parametrize(
    "args",
    [a for a in help_examples() if a[0] in ("plan", "train") and QUICKSTART in a],
    ids=" ".join,
)
def test_the_help_examples_of_plan_and_train_resolve_as_written(fedhet: CliRunner, args, tmp_path):
    """`plan` runs as written; a `train` example's arguments resolve the same way through
    `plan` (the same spec, the runs it would train), without the minutes of training."""
    result = fedhet("plan", *args[1:], "--store", tmp_path / "store")
    assert result.rc == 0 and "Traceback" not in result.stderr, result.stderr
    assert "missing" in result.stdout
