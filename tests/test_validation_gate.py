"""Validation is training's gatekeeper: every check that needs only the spec runs when it is
validated (so `fedhet spec validate` and the start of `fedhet train` refuse what a run would), a
field set where it does not apply is refused naming where it applies, the JSON Schema types the
matrix's entries, `spec show` fills them in, and hints repeat the user's overrides."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml
from conftest import TINY_SPEC, CliRunner, write_spec

from fedhet.core.errors import InputError
from fedhet.core.spec import (
    applicable_dump,
    expand,
    json_schema,
    load_mapping,
    load_spec,
    parse_spec,
)

SPECS = sorted(Path(__file__).parent.parent.joinpath("specs").glob("*.yaml"))
BN_METHODS = ["fedtan", "fedtan_ii", "fedavg_alg2", "fedbn", "silobn"]


def refusal(fedhet: CliRunner, *args, store: Path) -> str:
    """The one line of a command that exits 2 without a traceback."""
    result = fedhet(*args, store=store)
    assert result.rc == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip("\n").splitlines()
    return line


# --- spec-only checks run at validation ---------------------------------------------------


@pytest.mark.parametrize("name", BN_METHODS)
def test_batch_norm_methods_are_refused_without_batch_norm_layers(name):
    with pytest.raises(InputError, match=f"model.norm: {name} needs BatchNorm layers"):
        parse_spec({"algorithm": {"name": name}, "model": {"norm": "group"}})
    with pytest.raises(InputError, match="model.hidden: \\[\\] leaves the mlp no BatchNorm"):
        parse_spec(
            {"algorithm": {"name": name}, "model": {"arch": "mlp", "hidden": [], "norm": "batch"}}
        )
    parse_spec({"algorithm": {"name": name}, "model": {"norm": "batch"}})


def test_a_matrix_run_without_batch_norm_is_refused_before_any_run_starts(
    fedhet: CliRunner, tmp_path
):
    spec = write_spec(
        tmp_path / "bn.yaml",
        {
            **TINY_SPEC,
            "model": {"arch": "mlp", "hidden": [16], "norm": "batch"},
            "matrix": {"algorithm.name": ["fedavg", "fedtan"]},
        },
    )
    store = tmp_path / "store"
    for command in ("spec", "validate"), ("train",):
        line = refusal(fedhet, *command, spec, "model.norm=none", store=store)
        assert "model.norm: fedtan needs BatchNorm layers; set model.norm: batch" in line
    assert not store.exists() or not any(store.rglob("*.zarr"))  # fedavg's run never started


def test_vhl_classes_beyond_the_dataset_are_refused_at_validation():
    vhl = {"name": "fedavg", "vhl": {"classes": 11, "labels": "shared"}}
    with pytest.raises(InputError, match="algorithm.vhl.classes=11 exceeds the dataset's 10"):
        parse_spec({"algorithm": vhl})


def test_group_norm_groups_must_divide_the_widths(fedhet: CliRunner, tmp_path):
    spec = write_spec(tmp_path / "gn.yaml", TINY_SPEC)
    line = refusal(
        fedhet, "spec", "validate", spec, "model.norm=group", "model.groups=3", store=tmp_path
    )
    assert line.endswith(
        "override 'model.groups=3': model.groups: does not divide model.hidden width(s) [16]; "
        "choose groups that divides every width of [16] (got 3)"
    )


# --- fields that do not apply -------------------------------------------------------------


def test_a_model_field_for_another_arch_is_refused(fedhet: CliRunner, tmp_path):
    spec = write_spec(tmp_path / "mlp.yaml", TINY_SPEC)
    line = refusal(fedhet, "spec", "validate", spec, "model.channels=[8,8]", store=tmp_path)
    assert line == (
        "error: override 'model.channels=[8,8]': model.channels: applies to arch simple_cnn "
        "only; remove it or set model.arch"
    )
    line = refusal(fedhet, "spec", "validate", spec, "model.fc_width=7", store=tmp_path)
    assert "model.fc_width: applies to arch simple_cnn only" in line


def test_a_field_at_its_default_or_applying_to_some_run_is_kept():
    """A field at its default changes no key, so it may stay; and a field that applies to some
    runs of a matrix (fedtan_fmnist: channels for its simple_cnn runs) is in use."""
    mlp = {"arch": "mlp", "channels": [32, 64], "fc_width": 512}
    assert parse_spec({"model": mlp}).model.channels == [32, 64]
    both = {"model": {**mlp, "channels": [4, 8]}, "matrix": {"model.arch": ["mlp", "simple_cnn"]}}
    assert len(expand(parse_spec(both))) == 2
    with pytest.raises(InputError, match="model.channels: applies to arch simple_cnn only"):
        parse_spec({**both, "matrix": {"model.arch": ["mlp", "resnet20"]}})
    entries = {"model": [{"arch": "mlp", "width": 8}, {"arch": "simple_cnn"}]}
    with pytest.raises(
        InputError, match="model.width: applies to arch fedbr_cnn, resnet18, resnet20 only"
    ):
        parse_spec({"matrix": entries})


def test_switching_the_scheme_says_where_a_field_applies_and_how_to_drop_it(
    fedhet: CliRunner, tmp_path
):
    spec = write_spec(tmp_path / "dir.yaml", TINY_SPEC)
    line = refusal(fedhet, "spec", "validate", spec, "partition.scheme=iid", store=tmp_path)
    drop = "partition='{scheme: iid, clients: 4}'"
    assert line == (
        "error: override 'partition.scheme=iid': partition.alpha: applies to scheme "
        f"client_dirichlet, dirichlet, quantity only; drop it by setting the whole section: {drop}"
    )
    ((_, _, value),) = [shlex.split(drop)[0].partition("=")]
    fixed = load_spec(spec, [f"partition={value}"])
    assert fixed.partition.scheme == "iid" and fixed.partition.clients == 4
    with pytest.raises(InputError, match="partition.alpha: applies to scheme .*set partition"):
        parse_spec({"partition": {"scheme": "iid", "alpha": 0.1}})


def test_an_algorithm_field_for_another_algorithm_names_it():
    mu_owners = "algorithm.mu: applies to algorithm fedbr, fedprox, moon only"
    with pytest.raises(InputError, match=mu_owners):
        parse_spec({"algorithm": {"name": "fedavg", "mu": 0.1}})
    with pytest.raises(InputError, match="algorithm.vhl: applies to algorithm .*fedavg, .*fednova"):
        parse_spec({"algorithm": {"name": "tct", "vhl": {}}})
    with pytest.raises(InputError, match="algorithm.bogus: unknown field"):
        parse_spec({"algorithm": {"name": "fedavg", "bogus": 1}})


def test_an_objective_wrapper_as_algorithm_name_points_to_its_place(fedhet: CliRunner, tmp_path):
    spec = write_spec(tmp_path / "vhl.yaml", TINY_SPEC)
    line = refusal(fedhet, "spec", "validate", spec, "algorithm.name=vhl", store=tmp_path)
    assert "algorithm.name: vhl is an objective wrapper, not an algorithm" in line
    assert "algorithm: {name: fedavg, vhl: {}}" in line
    parse_spec({"algorithm": {"name": "fedavg", "vhl": {}}})  # where it points is valid


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_every_committed_spec_stays_valid(path):
    expand(load_spec(path))


# --- JSON Schema and spec show ------------------------------------------------------------


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema = json_schema()
    return jsonschema.validators.validator_for(schema)(schema)


@pytest.mark.parametrize(
    "matrix",
    [
        {"algorithm": [{"name": "fedprx"}]},
        {"algorithm": [{"name": "fedavg", "mu": 0.1}]},
        {"algorithm.name": ["fedavg", "fedprx"]},
        {"partition": [{"scheme": "iid", "alpha": 0.1}]},
        {"partition.scheme": ["lda"]},
        {"seed": ["zero"]},
        {"model.arch": ["vgg"]},
        {"federation.rounds": []},
    ],
)
def test_the_schema_types_matrix_entries(validator, matrix):
    with pytest.raises(InputError):  # what the schema refuses, validation refuses too
        expand(parse_spec({"matrix": matrix}))
    assert not validator.is_valid({"matrix": matrix})


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_the_schema_accepts_every_committed_spec(validator, path):
    assert validator.is_valid(load_mapping(path))  # a derived spec: with its base resolved


def test_spec_show_fills_in_matrix_entries(fedhet: CliRunner, tmp_path):
    matrix = {
        "algorithm": [{"name": "fedprox"}, {"name": "fedavg"}],
        "partition": [{"scheme": "classes"}],
        "seed": [0, 1],
    }
    spec = write_spec(tmp_path / "m.yaml", {**TINY_SPEC, "matrix": matrix})
    result = fedhet("spec", "show", spec, store=tmp_path)
    assert result.rc == 0, result.stderr
    shown = yaml.safe_load(result.stdout.split("# model split points")[0])["matrix"]
    assert shown["algorithm"] == [{"name": "fedprox", "mu": 0.01}, {"name": "fedavg"}]
    assert shown["partition"] == [
        {"clients": 10, "scheme": "classes", "classes_per_client": 2, "shuffle_classes": True}
    ]
    assert shown["seed"] == [0, 1]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"algorithm": {"name": "fedbr"}, "federation": {"momentum_buffers": "client"}},
            "federation.momentum_buffers: client is not supported by fedbr; use reset",
        ),
        (
            {
                "algorithm": {"name": "fedtan"},
                "model": {"norm": "batch"},
                "federation": {"momentum_buffers": "client"},
            },
            "federation.momentum_buffers: client is not supported by fedtan; use reset",
        ),
        (
            {"algorithm": {"name": "centralized"}, "federation": {"momentum_buffers": "client"}},
            "momentum_buffers: client keeps nothing: centralized's clients train without momentum",
        ),
        (
            {
                "algorithm": {"name": "fedavg", "local_momentum": 0},
                "federation": {"momentum_buffers": "client", "momentum": 0.9},
            },
            "momentum_buffers: client keeps nothing: fedavg's clients train without momentum",
        ),
        (
            {"algorithm": {"name": "fedavg", "vhl": {"labels": "shared", "predict": "all"}}},
            "algorithm.vhl.predict: all scores the virtual classes' extra outputs",
        ),
        (
            {"algorithm": {"name": "fedavg", "vhl": {"variant": "vfa", "virtual_scale": "clamp"}}},
            "algorithm.vhl.virtual_scale: variant vfa draws no virtual images",
        ),
        (
            {"algorithm": {"name": "fedimpro", "weight": 0, "sample_from": "client"}},
            "algorithm.sample_from: weight 0 samples no features",
        ),
        (
            {"algorithm": {"name": "fedbr", "debias_features": False, "pairing": "index"}},
            "algorithm.pairing: pairs the samples of L_con, which debias_features: false",
        ),
    ],
)
def test_an_official_setup_option_that_would_do_nothing_is_refused(spec, message):
    with pytest.raises(InputError, match=re.escape(message)):
        parse_spec({"data": {"dataset": "digits"}, **spec})


@pytest.mark.parametrize("path", SPECS, ids=lambda path: path.stem)
def test_every_committed_spec_as_shown_reads_back_as_the_same_runs(path):
    """`spec show` fills defaults in; what it prints is a spec with exactly the same runs (a
    check of one field against another must accept a filled-in default)."""
    spec = load_spec(path)
    shown = parse_spec(yaml.safe_load(yaml.safe_dump(applicable_dump(spec), sort_keys=False)))
    assert [run for _, run in expand(shown)] == [run for _, run in expand(spec)]


# --- hints --------------------------------------------------------------------------------


def test_the_hint_to_train_repeats_the_overrides(fedhet: CliRunner, tmp_path):
    spec = write_spec(tmp_path / "h.yaml", TINY_SPEC)
    overrides = ["federation.rounds=3", "partition={scheme: iid, clients: 2}"]
    line = refusal(fedhet, "report", spec, *overrides, store=tmp_path / "store")
    command = f"fedhet train {shlex.join([str(spec), *overrides])}"
    assert f"run `{command}` first or pass --train" in line
    assert load_spec(spec, shlex.split(command)[3:]).partition.clients == 2
