"""A plug-in that fails in any way costs one warning naming it and its distribution; every command
and spec that does not use it works unchanged, and a spec that uses it is refused in one line
naming it (fedhet.core.plugin_isolation).

Each broken plug-in is a distribution of its own (`broken-<kind>` 1.2.3, whose module and entry
point are `broken_<kind>`, the name of what it adds), made visible as pip would: its module and a
`*.dist-info` with its entry points in a folder that only the commands get on their PYTHONPATH.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import test_cli_exits
import test_inputs_cli
from conftest import REPO, TINY_SPEC, CliResult, CliRunner, cli_env, run_fedhet, write_spec

METHODS, DATASETS, MODELS = "fedhet.methods", "fedhet.datasets", "fedhet.models"

# a method whose algorithm plans a stage of its own (registered by `stages`)
METHOD = """
from typing import ClassVar, Literal
from pydantic import model_validator
from fedhet.plugin import Method, MethodConfig, ObjectiveEntry, StageNode
from fedhet.plugin import partition_node, train_node

class Config(MethodConfig):
    name: Literal["NAME"] = "NAME"
    def plan(self, spec):
        own = StageNode("broken_stage", 1, {}, {"partition": partition_node(spec)})
        return train_node(spec, own=own)
"""
VALIDATOR = """
    @model_validator(mode="after")
    def _check(self):
        raise RuntimeError("its check crashed")
"""
DATASET = """
from typing import ClassVar, Literal
from pydantic import model_validator
from fedhet.core.data_config import DataConfig, DataInfo

class THING(DataConfig):
    loader: ClassVar[str] = "fedhet.data.synthetic:generate"
    dataset: Literal["NAME"] = "NAME"
    def describe(self):
        return DataInfo((1, 8, 8), 10)
"""


@dataclass(frozen=True)
class Broken:
    group: str
    code: str
    problem: str  # what its warning, or the refusal of a spec using it, says
    loads: bool = False  # it loads (no warning): only a spec using it finds the fault
    stage: bool = False  # the fault shows once its stages are imported (train), not before
    in_specs: bool = True  # a spec can name what it adds


BROKEN = {
    "exits": Broken(METHODS, "import sys\nsys.exit(3)", "cannot be loaded: SystemExit: 3"),
    "interrupts": Broken(METHODS, "raise KeyboardInterrupt", "cannot be loaded: KeyboardInterrupt"),
    "raises": Broken(METHODS, "raise OSError('no GPU')", "cannot be loaded: OSError: no GPU"),
    "not-a-method": Broken(METHODS, "THING = print", "is not a fedhet.core.registry.Method"),
    "config-not-a-class": Broken(
        METHODS,
        "THING = Method('NAME', configs=('Config',))",
        "config 'Config' is not a MethodConfig",
    ),
    "objective-not-a-class": Broken(
        METHODS,
        METHOD + "THING = Method('NAME', (Config,), (ObjectiveEntry('own', 'Cfg', 'x:y'),))",
        "objective config 'Cfg' is not an ObjectiveConfig",
    ),
    "stages-missing": Broken(
        METHODS,
        METHOD + "THING = Method('NAME', (Config,), stages=('broken_stages_missing.gone',))",
        "cannot import its stages broken_stages_missing.gone: ModuleNotFoundError",
        stage=True,
    ),
    "commands-missing": Broken(
        METHODS,
        "from fedhet.plugin import Method\nTHING = Method('NAME', commands=('nowhere:app',))",
        "cannot import nowhere:app: ModuleNotFoundError",
        in_specs=False,
    ),
    "method-validator": Broken(
        METHODS,
        METHOD + VALIDATOR + "THING = Method('NAME', (Config,))",
        "its validation failed: RuntimeError: its check crashed",
        loads=True,
    ),
    "method-check": Broken(
        METHODS,
        METHOD
        + "    def check(self, spec):\n        raise RuntimeError('its check crashed')\n"
        + "THING = Method('NAME', (Config,))",
        "its check() failed: RuntimeError: its check crashed",
        loads=True,
    ),
    "dataset-exits": Broken(DATASETS, "raise SystemExit('bye')", "cannot be loaded: SystemExit"),
    "dataset-not-a-class": Broken(
        DATASETS, "THING = 3", "3 is not a fedhet.core.data_config.DataConfig"
    ),
    "dataset-validator": Broken(
        DATASETS, DATASET + VALIDATOR, "its validation failed: RuntimeError", loads=True
    ),
    "dataset-describe": Broken(
        DATASETS,
        DATASET.replace("return DataInfo((1, 8, 8), 10)", "raise ValueError('no file')"),
        "its describe() failed: ValueError: no file",
        loads=True,
    ),
    "model-interrupts": Broken(MODELS, "raise KeyboardInterrupt", "cannot be loaded"),
    "model-not-a-config": Broken(
        MODELS, "THING = dict", "is not a fedhet.core.model_config.ModelConfig"
    ),
}
BLOCK = {METHODS: ("algorithm", "name"), DATASETS: ("data", "dataset"), MODELS: ("model", "arch")}


def name(kind: str) -> str:
    """The module, entry point and added name of the plug-in of `kind`."""
    return "broken_" + kind.replace("-", "_")


def install(kind: str, code: str, group: str, site: Path) -> None:
    """Distribution `broken-<kind>` 1.2.3: `name(kind) = name(kind).plugin:THING`."""
    module = name(kind)
    (site / module).mkdir(parents=True)
    (site / module / "__init__.py").write_text("")
    if "Method(" in code and "import Method" not in code:
        code = "from fedhet.plugin import Method, ObjectiveEntry\n" + code
    (site / module / "plugin.py").write_text(textwrap.dedent(code).replace("NAME", module))
    info = site / f"{module}-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: broken-{kind}\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{module} = {module}.plugin:THING\n")


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Kind -> a folder holding that broken plug-in alone."""
    found = {}
    for kind, broken in BROKEN.items():
        found[kind] = tmp_path_factory.mktemp(kind)
        install(kind, broken.code, broken.group, found[kind])
    return found


def env_with(store: Path, *sites: Path) -> dict[str, str]:
    """The commands' environment, with `sites` after the PYTHONPATH that runs this tree."""
    path = [os.environ.get("PYTHONPATH", ""), *map(str, sites)]
    return cli_env(store, PYTHONPATH=os.pathsep.join(p for p in path if p))


def named(kind: str) -> str:
    return f"plugin 'broken-{kind}' 1.2.3 ({name(kind)} = {name(kind)}.plugin:THING)"


def assert_warned(result: CliResult, kind: str, expected: bool) -> None:
    """One warning line naming the plug-in, its distribution and its fault, or none."""
    assert "Traceback" not in result.stdout + result.stderr
    if not expected:
        assert result.plugin_warnings == ()
        return
    (warning,) = result.plugin_warnings
    assert warning.startswith(f"warning: {named(kind)}: ") and BROKEN[kind].problem in warning


def using(kind: str) -> dict:
    section, tag = BLOCK[BROKEN[kind].group]
    return {**TINY_SPEC, section: {**TINY_SPEC[section], tag: name(kind)}}


@pytest.mark.parametrize("kind", BROKEN)
def test_a_broken_plugin_costs_one_warning_and_changes_nothing_else(
    fedhet: CliRunner, sites: dict[str, Path], kind: str, tmp_path: Path
):
    broken, env = BROKEN[kind], env_with(tmp_path / "store", sites[kind])
    warns = not broken.loads and not broken.stage

    helped = fedhet("--help", env=env)
    assert (helped.rc, helped.stderr) == (0, "") and "Usage" in helped.stdout
    assert_warned(helped, kind, warns and broken.group == METHODS)  # --help loads methods only

    spec = write_spec(tmp_path / "tiny.yaml", TINY_SPEC)
    validated = fedhet("spec", "validate", spec, env=env)
    assert (validated.rc, validated.stderr) == (0, ""), validated.stderr
    assert "valid (1 run)" in " ".join(validated.stdout.split())  # rich wraps long paths
    assert_warned(validated, kind, warns)


@pytest.mark.parametrize("kind", [k for k, b in BROKEN.items() if b.in_specs and not b.stage])
def test_a_spec_using_a_broken_plugin_is_refused_in_one_line_naming_it(
    fedhet: CliRunner, sites: dict[str, Path], kind: str, tmp_path: Path
):
    spec = write_spec(tmp_path / "uses.yaml", using(kind))
    result = fedhet("spec", "validate", spec, env=env_with(tmp_path / "store", sites[kind]))
    assert result.rc == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    section, tag = BLOCK[BROKEN[kind].group]
    where = section if BROKEN[kind].loads else f"{section}.{tag}"
    assert line.startswith(f"error: {spec}: {where}: {named(kind)}: "), line
    assert BROKEN[kind].problem in line


@pytest.mark.slow
def test_stages_that_cannot_be_imported_stop_only_the_runs_that_need_them(
    fedhet: CliRunner, sites: dict[str, Path], tmp_path: Path
):
    store = tmp_path / "store"
    env = env_with(store, sites["stages-missing"])
    plain = fedhet("train", write_spec(tmp_path / "plain.yaml", TINY_SPEC), env=env)
    assert plain.rc == 0, plain.stderr
    assert_warned(plain, "stages-missing", True)
    assert len(list((store / "train").glob("*.zarr"))) == 1

    spec = write_spec(tmp_path / "uses.yaml", using("stages-missing"))
    assert fedhet("spec", "validate", spec, env=env).rc == 0  # validating imports no stage
    refused = fedhet("train", spec, env=env)
    assert refused.rc == 2 and "Traceback" not in refused.stderr
    (line,) = [line for line in refused.stderr.splitlines() if "error" in line]
    assert line == f"error: no stage 'broken_stage': {named('stages-missing')}: " + (
        "cannot import its stages broken_stages_missing.gone: ModuleNotFoundError: No module "
        "named 'broken_stages_missing.gone'"
    )
    assert len(list((store / "train").glob("*.zarr"))) == 1  # nothing of it stored


@pytest.mark.slow
def test_worker_processes_do_not_repeat_the_warning(
    fedhet: CliRunner, sites: dict[str, Path], tmp_path: Path
):
    spec = write_spec(tmp_path / "two.yaml", {**TINY_SPEC, "matrix": {"seed": [0, 1]}})
    env = env_with(tmp_path / "store", sites["exits"])
    trained = fedhet("train", spec, "--jobs", "2", env=env)
    assert trained.rc == 0, trained.stderr
    assert_warned(trained, "exits", True)  # the command's, none of its workers'
    assert named("exits") not in trained.stderr
    assert len(list((tmp_path / "store" / "train").glob("*.zarr"))) == 2


API = """
import sys, fedhet
from fedhet.core.errors import InputError
experiment = fedhet.load(sys.argv[1])
print("loaded", experiment.spec.name)
try:
    fedhet.load(sys.argv[2])
except InputError as err:
    print("refused:", err)
"""
FAILING = [k for k, b in BROKEN.items() if not b.loads and not b.stage]  # at loading


@pytest.fixture(scope="module")
def all_failing(sites: dict[str, Path]) -> list[Path]:
    return [sites[kind] for kind in FAILING]


@pytest.mark.slow
def test_the_python_api_loads_beside_every_broken_plugin(all_failing: list[Path], tmp_path: Path):
    tiny = write_spec(tmp_path / "tiny.yaml", TINY_SPEC)
    uses = write_spec(tmp_path / "uses.yaml", using("exits"))
    proc = subprocess.run(
        [sys.executable, "-c", API, tiny, uses],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env_with(tmp_path / "store", *all_failing),
        timeout=120,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    loaded, refused = proc.stdout.splitlines()
    assert loaded == "loaded tiny-digits"
    assert refused.startswith(f"refused: {uses}: algorithm.name: {named('exits')}: ")
    warned = proc.stderr.splitlines()  # by Python's last-resort handler: the message alone
    loaded_by_specs = [kind for kind in FAILING if BROKEN[kind].in_specs]  # not the commands
    assert len(warned) == len(loaded_by_specs)
    for kind in loaded_by_specs:
        (line,) = [w for w in warned if w.startswith(f"{named(kind)}: ")]
        assert BROKEN[kind].problem in line


@pytest.mark.slow
def test_the_console_command_starts_beside_every_broken_plugin(
    all_failing: list[Path], tmp_path: Path
):
    helped = run_fedhet("--help", env=env_with(tmp_path, *all_failing))
    assert (helped.rc, helped.stderr) == (0, "") and "Usage" in helped.stdout
    methods = [kind for kind in FAILING if BROKEN[kind].group == METHODS]  # what --help loads
    assert len(helped.plugin_warnings) == len(methods)
    for kind in methods:
        (line,) = [w for w in helped.plugin_warnings if w.startswith(f"warning: {named(kind)}: ")]
        assert BROKEN[kind].problem in line


SIGINT_ITSELF = "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(30)"


@pytest.mark.slow
def test_a_real_ctrl_c_while_a_plugin_imports_still_interrupts(tmp_path: Path):
    """A KeyboardInterrupt the plug-in raises is its failure; a SIGINT that arrives as it imports
    is the user's Ctrl-C: the command stops (130), and so does a Python program."""
    install("interrupted", SIGINT_ITSELF, METHODS, tmp_path / "site")
    env = env_with(tmp_path / "store", tmp_path / "site")
    stopped = run_fedhet("--help", env=env, timeout=25)
    assert stopped.rc == 130 and stopped.plugin_warnings == ()
    assert stopped.stderr == "interrupted; run the same command to resume\n"

    script = "import fedhet.core.registry as r; r.methods(); print('not interrupted')"
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=25
    )
    assert proc.returncode != 0 and "not interrupted" not in proc.stdout
    assert proc.stderr.splitlines()[-1] == "KeyboardInterrupt" and "skipped" not in proc.stderr


# existing CLI tests of exit codes, one-line errors and help, run as written beside broken plug-ins
# (one per entry-point group): what they check must not change. They run in this process, their
# commands given the broken plug-ins through PYTHONPATH, as a nested pytest did at the cost of a
# second interpreter and fork server.
@pytest.mark.slow
def test_the_cli_tests_pass_with_broken_plugins_installed(
    fedhet: CliRunner, sites: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    broken = [sites[kind] for kind in ("exits", "dataset-not-a-class", "model-interrupts")]
    monkeypatch.setenv("PYTHONPATH", env_with(tmp_path, *broken)["PYTHONPATH"])
    assert len(fedhet("--help").plugin_warnings) == 1  # the commands see them (--help: methods)

    for group in ([], ["spec"], ["artifacts"]):
        test_cli_exits.test_no_arguments_prints_help_once_on_stdout(group)
    test_cli_exits.test_help_paragraphs_rewrap_to_the_terminal_width()
    test_cli_exits.test_version()
    for number, case in enumerate(sorted(test_cli_exits.USAGE_ERRORS)):
        test_cli_exits.test_usage_errors_are_one_line_with_exit_2(case, tmp_path / str(number))
    (tmp_path / "tct").mkdir()
    test_inputs_cli.test_tct_without_stage1_rounds_is_refused_by_validate_as_by_train(
        fedhet, tmp_path / "tct"
    )
