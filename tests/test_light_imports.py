"""Planning is torch-free: `fedhet plan`, `fedhet runs` and `spec validate` of every committed
spec import no torch module (issue 22), so they answer before torch's seconds of imports."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


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
        ("plan", "specs/synthetic.yaml"),  # a dataset plug-in, described without torch
    ],
)
def test_planning_commands_import_no_torch(command, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "fedhet", *command, "--store", str(tmp_path)]
        if command[0] != "spec"
        else [sys.executable, "-X", "importtime", "-m", "fedhet", *command],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-1000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()]
    assert not [m for m in imported if m == "torch" or m.startswith("torch.")]
