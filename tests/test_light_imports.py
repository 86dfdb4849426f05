"""Planning is torch-free: `fedhet plan`, `fedhet runs` and `spec validate` of every committed
spec import no torch module (issue 22), so they answer before torch's seconds of imports. zarr
(0.2 s of imports) waits for an artifact's arrays: the command line, `spec validate` and `plan`
of a stored spec go without it (issue 36). Training a digits spec imports neither scikit-learn
nor scipy."""

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_SPEC, CliRunner, write_spec

REPO = Path(__file__).resolve().parents[1]


def imported(*args: str) -> list[str]:
    """The modules `python -m fedhet ARGS` imports; the command must succeed."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "fedhet", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-1000:]
    return [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()]


@pytest.mark.parametrize(
    "command",
    [
        ("plan", "specs/quickstart.yaml"),
        ("runs", "specs/quickstart.yaml"),
        ("plan", "specs/tct_fmnist.yaml"),
        ("plan", "specs/vhl_fmnist.yaml"),
        ("plan", "specs/fedbr_fmnist.yaml"),
        ("plan", "specs/fednova_fmnist.yaml"),
        ("plan", "specs/tune_digits.yaml", "--tune"),
        ("spec", "validate", "specs/all_methods_fmnist.yaml"),
        ("spec", "show", "specs/all_methods_fmnist.yaml"),  # issue 44: 6.7 s when it did
        ("plan", "specs/synthetic.yaml"),  # a dataset plug-in, described without torch
    ],
)
def test_planning_commands_import_no_torch(command, tmp_path):
    store = () if command[0] == "spec" else ("--store", str(tmp_path))
    modules = imported(*command, *store)
    assert not [m for m in modules if m == "torch" or m.startswith("torch.")]


def test_the_command_line_and_spec_validate_import_no_zarr():
    probe = "import sys, fedhet.cli; print('zarr' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stdout + proc.stderr
    assert "zarr" not in imported("spec", "validate", "specs/all_methods_fmnist.yaml")


def test_planning_a_stored_spec_imports_no_zarr(fedhet: CliRunner, tmp_path):
    spec, store = write_spec(tmp_path / "spec.yaml", TINY_SPEC), tmp_path / "store"
    assert fedhet("train", spec, store=store).rc == 0
    assert "zarr" not in imported("plan", str(spec), "--store", str(store))


def test_the_python_api_imports_no_pandas_torch_or_zarr_at_import():
    """`import fedhet.api` (and opening a store's session) costs none of the heavy imports:
    pandas waits for a table, torch for a computation, zarr for an artifact's arrays."""
    probe = (
        "import sys, fedhet.api; fedhet.api.artifacts('no-such-store');"
        "print(sorted({'pandas', 'torch', 'zarr'} & set(sys.modules)))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_training_a_digits_spec_imports_neither_scikit_learn_nor_scipy(tmp_path):
    """scikit-learn's imports (scipy.stats, pandas: over a second) are no part of a digits run:
    its data is read from scikit-learn's folder, and a partition's checks need no scipy."""
    spec = write_spec(tmp_path / "spec.yaml", TINY_SPEC)
    modules = imported("train", str(spec), "--store", str(tmp_path / "store"))
    assert "torch" in modules  # it did train
    assert not [m for m in modules if m.split(".")[0] in ("sklearn", "scipy", "pandas")]
