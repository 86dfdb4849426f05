"""Specs: defaults, forbidden unknown keys, ranges, cross-field checks, matrix expansion, JSON
Schema, and one-line exit-code-2 errors for bad input (in-process and through the CLI)."""

from __future__ import annotations

import copy
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, TINY_SPEC, CliResult, CliRunner, cli_env, write_spec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from fedhet.core.errors import InputError
from fedhet.core.registry import configs
from fedhet.core.spec import Spec, expand, json_schema, load_spec, parse_spec
from fedhet.execution.planning import runs_of

QUICKSTART = REPO / "specs" / "quickstart.yaml"
SCHEMES = ["iid", "dirichlet", "classes", "subset", "quantity", "rotation", "client_dirichlet"]


def with_value(data: dict, dotted: str, value: Any) -> dict:
    """A deep copy of `data` with `value` at the dotted path (sections created as needed)."""
    data = copy.deepcopy(data)
    *parents, leaf = dotted.split(".")
    node = data
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[leaf] = value
    return data


def input_error(data: Any) -> str:
    with pytest.raises(InputError) as caught:
        parse_spec(data)
    message = str(caught.value)
    assert "\n" not in message
    return message


# --- defaults -----------------------------------------------------------------------------


def sections(model: BaseModel, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Paths of `model` and of every nested section (pydantic model) inside it."""
    found = [path]
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            found += sections(value, (*path, name))
    return found


def test_empty_spec_gets_every_default():
    spec = parse_spec({})
    dumped = spec.model_dump(mode="json")
    for path in sections(spec):
        node, model = dumped, spec
        for part in path:
            node, model = node[part], getattr(model, part)
        fields = set(type(model).model_fields)
        left_out = fields - set(node)  # only options that are off may be left out of the dump:
        # unset, or holding a default that keeps every key (OMIT_IF_DEFAULT)
        off = {f for f in fields if getattr(model, f) is None} | set(model.omitted_fields())
        assert set(node) <= fields and left_out <= off, path
    assert (spec.data.dataset, spec.partition.scheme, spec.algorithm.name) == (
        "digits",
        "iid",
        "fedavg",
    )
    assert spec.clients_per_round == spec.partition.clients  # all clients by default


def test_section_defaults_depend_on_the_chosen_variant():
    spec = parse_spec({"partition": {"scheme": "dirichlet"}, "algorithm": {"name": "fedprox"}})
    assert (spec.partition.alpha, spec.partition.min_samples) == (0.5, 0)
    assert spec.algorithm.mu == 0.01
    rotated = parse_spec({"partition": {"scheme": "rotation", "clients": 3}})
    assert rotated.partition.rotation.step == 15.0


def test_a_filled_in_spec_parses_back_to_itself():
    spec = load_spec(QUICKSTART)
    assert parse_spec(spec.model_dump(mode="json")) == spec


# --- unknown keys -------------------------------------------------------------------------


def variant_specs() -> list[Spec]:
    """Filled-in specs covering every partition scheme (with a rotation) and every algorithm."""
    specs = [
        parse_spec({"partition": {"scheme": s, "clients": 4, "rotation": {"step": 10.0}}})
        for s in SCHEMES
    ]
    others = sorted(set(configs()) - {"fedavg"})  # fedavg is the default of the specs above
    # rounds enough for TCT's default stage 1 (T1 = federation.rounds - T2 = 100)
    long = {"rounds": 150}
    model = {"norm": "batch"}  # the BatchNorm methods need BatchNorm layers
    data = {"server": 100, "validation": 0.2}  # FedDF's server data and early-stopping split
    specs += [
        parse_spec({"algorithm": {"name": name}, "federation": long, "model": model, "data": data})
        for name in others
    ]
    return specs


@pytest.mark.parametrize(
    "spec", variant_specs(), ids=lambda s: f"{s.partition.scheme}-{s.algorithm.name}"
)
def test_every_section_forbids_unknown_keys(spec: Spec):
    data = spec.model_dump(mode="json")
    for path in sections(spec):
        dotted = ".".join((*path, "bogus_field"))
        message = input_error(with_value(data, dotted, 1))
        assert f"{dotted}: unknown field" in message
        assert "spelling" in message


def test_schema_forbids_additional_properties_everywhere():
    schema = json_schema()
    objects = [schema, *schema["$defs"].values()]
    assert all(o.get("additionalProperties") is False for o in objects if "properties" in o)


def test_schema_lists_every_algorithm_and_section():
    schema = json_schema()
    text = json.dumps(schema)
    for name in configs():
        assert f'"{name}"' in text
    mapping = schema["properties"]["algorithm"]["discriminator"]["mapping"]
    assert set(mapping) == set(configs())
    # every section, and `base:` (a derived spec's file, resolved before validation)
    assert set(schema["properties"]) == {*Spec.model_fields, "base"}


# --- ranges and cross-field checks --------------------------------------------------------

OUT_OF_RANGE = [
    ("seed", -1),
    ("partition.clients", 0),
    ("partition.alpha", 0.0),
    ("partition.alpha", -0.5),
    ("partition.min_samples", -1),
    ("federation.rounds", 0),
    ("federation.lr", 0.0),
    ("federation.lr", float("inf")),
    ("federation.lr", float("nan")),
    ("federation.fraction", 1.5),
    ("federation.momentum", 1.0),
    ("federation.batch_size", 0),
    ("eval.every", 0),
    ("eval.target_accuracy", 1.5),
    ("runtime.threads", 0),
    ("algorithm.mu", -0.1),
]


@pytest.mark.parametrize(("field", "value"), OUT_OF_RANGE)
def test_out_of_range_values_are_rejected_naming_the_field(field: str, value: Any):
    base = {"partition": {"scheme": "dirichlet"}, "algorithm": {"name": "fedprox"}}
    message = input_error(with_value(base, field, value))
    assert f"spec: {field}: " in message
    assert f"(got {value!r})" in message


IN_RANGE = [
    ("partition.alpha", 1e-9),
    ("federation.rounds", 1),
    ("federation.fraction", 1.0),
    ("federation.momentum", 0.0),
    ("eval.target_accuracy", 1.0),
    ("algorithm.mu", 0.0),
]


@pytest.mark.parametrize(("field", "value"), IN_RANGE)
def test_boundary_values_are_accepted(field: str, value: Any):
    base = {"partition": {"scheme": "dirichlet"}, "algorithm": {"name": "fedprox"}}
    spec = parse_spec(with_value(base, field, value))
    section, name = field.split(".")
    assert getattr(getattr(spec, section), name) == value


def test_options_at_their_defaults_keep_every_key():
    """The FedBR-alignment options, written out at their defaults, change no stage key."""
    from fedhet.execution.planning import runs_of

    base = {
        "partition": {"scheme": "client_dirichlet", "rotation": {"step": 15}},
        "algorithm": {"name": "fedbr"},
    }
    explicit = with_value(base, "partition.concentration", "uniform")
    explicit = with_value(explicit, "partition.rotation.interpolation", "bilinear")
    explicit = with_value(explicit, "algorithm.pairing", "all")

    def keys(data):
        return [node.key for run in runs_of(parse_spec(data)) for node in run.node.walk()]

    assert keys(explicit) == keys(base)
    for field, value in [
        ("partition.concentration", "by_share"),
        ("partition.rotation.interpolation", "nearest"),
        ("algorithm.pairing", "index"),
    ]:
        assert keys(with_value(base, field, value)) != keys(base), field


def test_clients_per_round_cannot_exceed_clients():
    base = {"partition": {"scheme": "iid", "clients": 5}}
    assert parse_spec(with_value(base, "federation.clients_per_round", 5)).clients_per_round == 5
    message = input_error(with_value(base, "federation.clients_per_round", 6))
    assert "federation.clients_per_round=6" in message and "partition.clients=5" in message


def test_participation_and_duration_each_have_one_setting():
    assert "not both" in input_error({"federation": {"clients_per_round": 2, "fraction": 0.5}})
    assert "not both" in input_error({"federation": {"local_steps": 5, "local_epochs": 2}})
    spec = parse_spec(
        {"partition": {"scheme": "iid", "clients": 10}, "federation": {"fraction": 0.3}}
    )
    assert spec.clients_per_round == 3


@pytest.mark.parametrize("scheme", ["rotation", "dirichlet"])
def test_rotation_angles_need_one_angle_per_client(scheme: str):
    rotation = {"angles": [0.0, 90.0, 180.0]}
    ok = parse_spec({"partition": {"scheme": scheme, "clients": 3, "rotation": rotation}})
    assert ok.partition.rotation.angles == [0.0, 90.0, 180.0]
    message = input_error({"partition": {"scheme": scheme, "clients": 4, "rotation": rotation}})
    assert "partition.rotation.angles has 3 entries for 4 clients" in message


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"partition": {"scheme": "nope"}}, "partition.scheme: unknown value 'nope'; choose one"),
        ({"partition": {"alpha": 0.1}}, "partition.scheme: missing"),
        ({"algorithm": {"name": "nope"}}, "algorithm.name: unknown or missing algorithm"),
        ({"algorithm": {"mu": 1.0}}, "algorithm.name: unknown or missing algorithm"),
        ({"algorithm": "fedavg"}, "algorithm: must be a mapping"),
        ({"algorithm": {"name": ["fedavg"]}}, "algorithm.name: unknown or missing algorithm"),
        ({"seed": "zero"}, "seed: input should be a valid integer"),
        ({"model": {"hidden": [8, 0]}}, "model.hidden.1: input should be greater than or equal"),
        ({"partition": "iid"}, "partition: input should be a valid dictionary"),
        (
            {"partition": {"scheme": "client_dirichlet", "concentration": "share"}},
            "partition.concentration: ",
        ),
        (
            {"partition": {"scheme": "rotation", "rotation": {"interpolation": "cubic"}}},
            "partition.rotation.interpolation: ",
        ),
        ({"algorithm": {"name": "fedbr", "pairing": "first"}}, "algorithm.pairing: "),
        ({"model": {"arch": "fedbr"}}, "model.arch: "),
        (
            {"model": {"arch": "fedbr_cnn", "width": 12, "norm": "group", "groups": 8}},
            "does not divide fedbr_cnn conv",
        ),
    ],
)
def test_messages_locate_the_problem_as_the_user_wrote_it(data: dict, expected: str):
    assert expected in input_error(data)


# --- matrix -------------------------------------------------------------------------------


def test_quickstart_matrix_expands_to_every_combination_with_values_applied():
    spec = load_spec(QUICKSTART)
    runs = expand(spec)
    assert len(runs) == len(spec.matrix["algorithm"]) * len(spec.matrix["partition"])
    seen = set()
    for axes, run in runs:
        assert run.matrix is None
        config = configs()[axes["algorithm"]["name"]]
        assert run.algorithm == config.model_validate(axes["algorithm"])
        assert run.partition == parse_spec({"partition": axes["partition"]}).partition
        assert run.federation == spec.federation and run.model == spec.model  # kept from base
        seen.add(json.dumps(axes, sort_keys=True))
    assert len(seen) == len(runs)


def test_algorithm_name_axis_starts_each_algorithm_from_its_defaults():
    spec = parse_spec(
        {
            "algorithm": {"name": "fedprox", "mu": 0.5},
            "federation": {"rounds": 150},  # TCT's default T1 = rounds - T2 (100)
            "model": {"norm": "batch"},  # for the BatchNorm methods
            "data": {"server": 100, "validation": 0.2},  # for FedDF's defaults
            "matrix": {"algorithm.name": sorted(configs())},
        }
    )
    runs = expand(spec)
    assert [r.algorithm.name for _, r in runs] == sorted(configs())
    for _, run in runs:
        assert run.algorithm == configs()[run.algorithm.name](name=run.algorithm.name)


def test_scalar_axes_multiply_and_keep_the_rest_of_the_spec():
    spec = parse_spec(
        {
            "federation": {"rounds": 7, "lr": 0.3},
            "matrix": {"federation.lr": [0.1, 0.01], "seed": [0, 1, 2]},
        }
    )
    runs = expand(spec)
    combos = [(r.federation.lr, r.seed) for _, r in runs]
    assert combos == list(itertools.product([0.1, 0.01], [0, 1, 2]))
    assert [axes for axes, _ in runs] == [
        {"federation.lr": lr, "seed": seed} for lr, seed in combos
    ]
    assert all(r.federation.rounds == 7 for _, r in runs)


@pytest.mark.parametrize("reverse", [False, True])
def test_section_axes_apply_before_the_fields_inside_them(reverse: bool):
    axes = {
        "partition": [{"scheme": "dirichlet", "clients": 5}],
        "partition.alpha": [0.1, 1.0],
        "algorithm.name": ["fedprox"],
        "algorithm.mu": [0.2, 0.3],
    }
    if reverse:
        axes = dict(reversed(axes.items()))
    runs = expand(parse_spec({"matrix": axes}))
    got = sorted((r.partition.clients, r.partition.alpha, r.algorithm.mu) for _, r in runs)
    assert got == sorted(itertools.product([5], [0.1, 1.0], [0.2, 0.3]))


@pytest.mark.parametrize(
    ("matrix", "expected"),
    [
        ({"federation.bogus": [1]}, "federation.bogus: unknown field"),
        ({"federation.rounds": [5, 0]}, "federation.rounds: input should be greater"),
        ({"seed": []}, "matrix.seed: list should have at least 1 item"),
        ({"seed.x": [1]}, "seed is not a section"),
    ],
)
def test_bad_matrix_axes_are_input_errors(matrix: dict, expected: str):
    with pytest.raises(InputError, match=re.escape(expected)):
        expand(parse_spec({"matrix": matrix}))


# --- malformed specs thrown at the loader -------------------------------------------------

NAMES = [*SCHEMES, *configs(), "digits", "mnist", "mlp", "batch", "auto", "cpu"]
PATHS = [
    "name", "seed", "data", "data.dataset", "data.root", "data.download", "partition",
    "partition.scheme", "partition.clients", "partition.alpha", "partition.classes_per_client",
    "partition.rotation", "partition.rotation.angles", "partition.rotation.step", "model",
    "model.arch", "model.hidden", "model.channels", "federation", "federation.rounds",
    "federation.clients_per_round", "federation.fraction", "federation.local_epochs",
    "federation.local_steps", "federation.lr", "algorithm", "algorithm.name", "algorithm.mu",
    "eval", "eval.target_accuracy", "runtime.device", "runtime.threads", "matrix", "matrix.seed",
    "matrix.algorithm.name", "matrix.partition", "matrix.federation.lr", "bogus",
]  # fmt: skip
SPECIAL = [None, True, 0, -1, 1, 2**64, 0.0, -0.5, 1e-300, float("inf"), float("nan"), "", [], {}]
scalars = st.one_of(
    st.sampled_from(SPECIAL),
    st.sampled_from(NAMES),
    st.integers(-3, 12),
    st.floats(),
    st.text(max_size=6),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(NAMES), inner),
    max_leaves=8,
)
VALID = {
    "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.3},
    "algorithm": {"name": "fedprox", "mu": 0.1},
    "matrix": {"seed": [0, 1]},
}


def set_matrix_or_field(data: dict, path: str, value: Any) -> dict:
    if path.startswith("matrix."):  # matrix axes are dotted keys of one mapping
        data = copy.deepcopy(data)
        if not isinstance(data.get("matrix"), dict):
            data["matrix"] = {}
        data["matrix"][path.removeprefix("matrix.")] = value
        return data
    return with_value(data, path, value)


def check_spec_or_input_error(load: Any) -> None:
    """`load()` returns a spec whose runs and keys can be planned, or raises InputError."""
    try:
        spec = load()
        keys = [node.key for run in runs_of(spec) for node in run.node.walk()]
    except InputError as err:
        assert "\n" not in str(err) and str(err)
        return
    assert all(len(k) == 64 for k in keys)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(edits=st.lists(st.tuples(st.sampled_from(PATHS), values), min_size=1, max_size=4))
def test_malformed_spec_mappings_raise_only_input_errors(edits):
    data = VALID
    for path, value in edits:
        data = set_matrix_or_field(data, path, value)
    check_spec_or_input_error(lambda: parse_spec(data))


YAML_NOISE = list(":{}[],-#'\"\t\n !&*|>%@`?\\") + ["  ", "\n  ", ": ", "- ", "!!python/object "]


@settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    edits=st.lists(
        st.tuples(st.integers(0, 10_000), st.integers(0, 3), st.sampled_from(YAML_NOISE)),
        min_size=1,
        max_size=4,
    ),
    junk=st.one_of(st.none(), st.text(max_size=40), st.binary(max_size=20)),
)
def test_malformed_yaml_files_raise_only_input_errors(tmp_path: Path, edits, junk):
    text = QUICKSTART.read_text()
    for position, removed, noise in edits:
        at = position % (len(text) + 1)
        text = text[:at] + noise + text[at + removed :]
    path = tmp_path / "fuzz.yaml"
    if isinstance(junk, bytes):
        path.write_bytes(text.encode() + junk)
    else:
        path.write_text(text if junk is None else junk)
    check_spec_or_input_error(lambda: load_spec(path))


# --- the CLI's answer to bad input --------------------------------------------------------

BAD_SPECS = {
    "unknown key": (
        with_value(TINY_SPEC, "federation.learning_rate", 0.1),
        ["federation.learning_rate", "unknown field", "remove it or fix its spelling"],
    ),
    "misspelt key": (
        with_value(TINY_SPEC, "federation.batchsize", 32),
        ["federation.batchsize: unknown field; did you mean batch_size?"],
    ),
    "misspelt key of the chosen scheme": (
        with_value(TINY_SPEC, "partition.alpah", 0.1),
        ["partition.alpah: unknown field; did you mean alpha?"],
    ),
    "wrong type": (
        with_value(TINY_SPEC, "federation.rounds", "many"),
        ["federation.rounds", "valid integer", "'many'"],
    ),
    "out of range": (
        with_value(TINY_SPEC, "partition.alpha", -1.0),
        ["partition.alpha", "greater than 0", "-1.0"],
    ),
    "unknown momentum buffers": (
        with_value(TINY_SPEC, "federation.momentum_buffers", "keep"),
        ["federation.momentum_buffers", "'reset' or 'client'", "'keep'"],
    ),
    "local momentum out of range": (
        with_value(TINY_SPEC, "algorithm.local_momentum", 1.0),
        ["algorithm.local_momentum", "less than 1", "1.0"],
    ),
    "kept buffers of a method with its own optimizers": (
        with_value(
            with_value(TINY_SPEC, "algorithm", {"name": "fedbr"}),
            "federation.momentum_buffers",
            "client",
        ),
        ["federation.momentum_buffers: client is not supported by fedbr", "use reset"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_cli_bad_spec_exits_2_with_one_line(fedhet: CliRunner, tmp_path: Path, case: str):
    data, expected = BAD_SPECS[case]
    path = write_spec(tmp_path / "bad.yaml", data)
    assert_one_line_input_error(fedhet("spec", "validate", path), [str(path), *expected])


def test_cli_names_a_bad_matrix_run_by_its_axis_values(fedhet: CliRunner, tmp_path: Path):
    matrix = {"algorithm": [{"name": "fedavg"}, {"name": "fedprox", "mu": -1}], "seed": [1]}
    path = write_spec(tmp_path / "bad.yaml", with_value(TINY_SPEC, "matrix", matrix))
    expected = "matrix run algorithm={name: fedprox, mu: -1}, seed=1: algorithm.mu: input should"
    assert_one_line_input_error(fedhet("spec", "validate", path), [expected])


def test_cli_yaml_syntax_error_names_file_and_line(fedhet: CliRunner, tmp_path: Path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\npartition: {scheme: iid, clients: 4\nseed: 1\n")
    result = fedhet("partition", path, store=tmp_path / "store")
    assert_one_line_input_error(result, [str(path), "line 3", "YAML syntax error"])
    assert not (tmp_path / "store").exists()


def test_console_script_reports_a_missing_file(tmp_path: Path):
    missing = tmp_path / "nope.yaml"
    script = Path(sys.executable).with_name("fedhet")
    proc = subprocess.run(
        [script, "spec", "validate", missing], capture_output=True, text=True, env=cli_env()
    )
    result = CliResult(proc.returncode, proc.stdout, proc.stderr)
    assert_one_line_input_error(result, [str(missing), "not found", "pass the path"])


def assert_one_line_input_error(result: CliResult, expected: list[str]) -> None:
    assert result.rc == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip("\n").splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in expected:
        assert fragment in lines[0]


def test_matrix_keeps_options_of_the_base_algorithm():
    spec = parse_spec({"algorithm": {"name": "fedprox", "mu": 0.5}, "matrix": {"seed": [0, 1]}})
    runs = expand(spec)
    assert [s.algorithm.mu for _, s in runs] == [0.5, 0.5]


def test_local_training_length_is_required():
    with pytest.raises(InputError, match="local_epochs or local_steps"):
        parse_spec({"federation": {"local_epochs": None}})


# --- malformed specs through the CLI, end to end ------------------------------------------

PLAUSIBLE = st.integers(0, 5) | st.sampled_from([0.1, 0.5, 1.0, *NAMES])  # some specs train
TINY_BUDGET = with_value(
    with_value(TINY_SPEC, "federation", {"rounds": 1, "batch_size": 16, "local_steps": 2}),
    "runtime",
    {"progress": False, "threads": 1},
)


def assert_clean_exit(result: CliResult, command: str) -> None:
    """Exit 0, or 1/2 with one `error:` line on stderr, the last; never a traceback."""
    assert result.rc in (0, 1, 2), (command, result.rc, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    if result.rc:
        errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
        assert len(errors) == 1 and result.stderr.rstrip("\n").endswith(errors[0]), result.stderr


@settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    edits=st.lists(st.tuples(st.sampled_from(PATHS), PLAUSIBLE | values), min_size=1, max_size=2)
)
def test_malformed_specs_through_the_cli_exit_cleanly(fedhet: CliRunner, tmp_path: Path, edits):
    data = TINY_BUDGET
    for path, value in edits:
        data = set_matrix_or_field(data, path, value)
    spec = tmp_path / "fuzz.yaml"
    spec.write_text(json.dumps(data, allow_nan=True))  # JSON is YAML, inf and nan included
    validated = fedhet("spec", "validate", spec)
    assert_clean_exit(validated, "spec validate")
    if validated.rc == 2:
        assert len(validated.stderr.strip("\n").splitlines()) == 1, validated.stderr
    trained = fedhet("train", spec, "--format", "csv", store=tmp_path / "store")
    assert_clean_exit(trained, "train")
    if validated.rc == 2:  # train refuses what validate refuses, the same way
        assert trained.stderr == validated.stderr
