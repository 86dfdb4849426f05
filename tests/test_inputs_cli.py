"""Bounded inputs and the commands' common preamble: a model too big for memory is refused before
anything is allocated, a bad spec answers before the heavy imports, every command computes with
`runtime.threads`, and eval/report take overrides (eval also --format)."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_SPEC, CliRunner, write_spec

from fedhet.core.errors import InputError
from fedhet.core.spec import parse_spec


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("federation.rounds", 10**6 + 1),
        ("federation.batch_size", 10**9),
        ("model.fc_width", 10**7),
        ("partition.alpha", 1e300),
        ("runtime.threads", 10**5),
    ],
)
def test_numbers_past_what_the_code_honours_are_refused(field, value):
    section, name = field.split(".")
    data = (
        {"partition": {"scheme": "dirichlet", name: value}}
        if section == "partition"
        else {section: {name: value}}
    )
    with pytest.raises(InputError, match=rf"spec: {field}: input should be less than or equal"):
        parse_spec(data)


def test_a_model_too_big_for_memory_is_refused_with_its_size(fedhet: CliRunner, tmp_path):
    spec = write_spec(
        tmp_path / "big.yaml", {**TINY_SPEC, "model": {"arch": "mlp", "hidden": [10**6, 10**6]}}
    )
    for command in ("spec", "validate"), ("train",):
        result = fedhet(*command, spec, store=tmp_path / "store")
        assert result.rc == 2 and "Traceback" not in result.stderr
        (line,) = result.stderr.strip("\n").splitlines()
        assert f"{spec}: model (mlp): 1,000,076,000,010 parameters need about" in line
        assert "14,902.3 GiB" in line and "narrow model.hidden" in line
    assert not (tmp_path / "store").exists()


def test_more_clients_than_training_samples_are_refused_before_anything_is_allocated(
    fedhet: CliRunner, tmp_path
):
    """digits has 1438 training samples: 1439 clients cannot each get one."""
    crowd = {**TINY_SPEC, "partition": {"scheme": "iid", "clients": 1439}}
    spec = write_spec(tmp_path / "crowd.yaml", crowd)
    for command in ("spec", "validate"), ("train",):
        result = fedhet(*command, spec, store=tmp_path / "store")
        assert result.rc == 2 and "Traceback" not in result.stderr
        (line,) = result.stderr.strip("\n").splitlines()
        assert line == (
            f"error: {spec}: partition.clients: 1439 clients for the 1438 training samples of "
            "digits, so some would hold none; give at most 1438 clients"
        )
    assert not (tmp_path / "store").exists()
    as_many = fedhet("spec", "validate", spec, "partition.clients=1438")
    assert as_many.rc == 0, as_many.stderr


def test_tct_without_stage1_rounds_is_refused_by_validate_as_by_train(fedhet: CliRunner, tmp_path):
    # T1 defaults to federation.rounds - stage2.rounds: 2 - 100 here
    spec = write_spec(tmp_path / "tct.yaml", {**TINY_SPEC, "algorithm": {"name": "tct"}})
    for command in ("spec", "validate"), ("train",):
        result = fedhet(*command, spec, store=tmp_path / "store")
        assert result.rc == 2 and "Traceback" not in result.stderr
        (line,) = result.stderr.strip("\n").splitlines()
        assert "algorithm.stage1.rounds: unset, so T1 = federation.rounds" in line
        assert "set stage1.rounds or raise federation.rounds" in line
    fixed = fedhet("spec", "validate", spec, "algorithm.stage1.rounds=2")
    assert fixed.rc == 0 and "valid" in fixed.stdout and "(1 run)" in fixed.stdout
    assert not (tmp_path / "store").exists()


def test_a_missing_spec_is_answered_before_torch_is_imported(tmp_path):
    probe = (
        "import sys\nfrom fedhet.cli import main\n"
        f"sys.argv = ['fedhet', 'train', {str(tmp_path / 'nope.yaml')!r}]\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    assert exit.code == 2, exit.code\n"
        "print('torch' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "not found" in proc.stderr and proc.stdout.split() == ["False"]


@pytest.fixture(scope="module")
def trained(fedhet: CliRunner, tmp_path_factory) -> tuple[Path, Path]:
    """(spec, store) of a tiny run whose partition was computed by `fedhet partition`."""
    folder = tmp_path_factory.mktemp("inputs")
    spec = write_spec(folder / "tiny.yaml", {**TINY_SPEC, "runtime": {"threads": 1}})
    store = folder / "store"
    assert fedhet("partition", spec, store=store).rc == 0
    result = fedhet("train", spec, store=store)
    assert result.rc == 0, result.stderr
    # the partition was computed with runtime.threads as well: its reuse is no surprise
    assert "reusing the stored artifact" in result.stderr
    assert "another environment" not in result.stderr
    return spec, store


def test_eval_takes_overrides_and_formats(fedhet: CliRunner, trained):
    spec, store = trained
    table = fedhet("eval", spec, store=store)
    assert table.rc == 0 and "per class" in table.stdout and "CGV" not in table.stdout
    as_csv = fedhet("eval", spec, "--format", "csv", "--cgv", store=store)
    (row,) = csv.DictReader(io.StringIO(as_csv.stdout))
    assert row["seed"] == "3" and len(row["per_class_pct"].split()) == 10
    assert 0 < float(row["accuracy_pct"]) <= 100 and float(row["cgv_total"]) > 0
    markdown = fedhet("eval", spec, "--format", "markdown", store=store)
    assert markdown.stdout.startswith("**tiny**") and "| accuracy % |" in markdown.stdout
    other_seed = fedhet("eval", spec, "seed=4", store=store)  # an override: a run not stored
    assert other_seed.rc == 2 and "1 of 1 runs are not stored" in other_seed.stderr


def test_report_takes_overrides(fedhet: CliRunner, trained, tmp_path):
    spec, store = trained
    result = fedhet("report", spec, "federation.lr=0.1", "--out", tmp_path, store=store)
    assert result.rc == 2 and "not stored" in result.stderr  # another learning rate: new runs
    result = fedhet("report", spec, "name=renamed", "--out", tmp_path, store=store)
    assert result.rc == 0, result.stderr  # the name enters no key: the stored run is reported
    assert (tmp_path / "renamed.md").is_file()  # named after the overridden name
