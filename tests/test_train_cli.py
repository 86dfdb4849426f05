"""`fedhet train/eval/report` end to end on digits: SIGKILL and resume, divergence, the eval
JSON (with CGV) and the paper-style report of a 2x2 matrix."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
import zarr
from conftest import markdown_tables
from matplotlib.colors import to_rgb
from matplotlib.image import imread

from fedhet.cli import main
from fedhet.core.spec import load_spec
from fedhet.core.store import ArtifactStore
from fedhet.data.datasets import load_dataset
from fedhet.execution.planning import runs_of

torch.set_num_threads(1)
RUNTIME = {"threads": 1, "progress": False, "device": "cpu"}


def write_spec(folder: Path, name: str, **sections) -> Path:
    raw = {
        "name": name,
        "seed": 0,
        "data": {"dataset": "digits"},
        "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.5},
        "model": {"arch": "mlp", "hidden": [16]},
        "federation": {"rounds": 2, "batch_size": 64, "lr": 0.05},
        "runtime": RUNTIME,
        **sections,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def fedhet(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run the CLI in this process: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["fedhet", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def train_key(spec_path: Path) -> str:
    (run,) = runs_of(load_spec(spec_path))
    return run.node.key


def read_arrays(group: zarr.Group, name: str) -> dict[str, np.ndarray]:
    return {key: np.asarray(arr[...]) for key, arr in group[name].arrays()}


# --- SIGKILL and resume -----------------------------------------------------------------


ROUNDS = 16


def newest_checkpoint(partial: Path) -> Path | None:
    found = sorted(partial.glob("ckpt-*.zarr"))
    return found[-1] if found else None


def test_sigkilled_train_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch, capsys):
    sections = {
        "partition": {"scheme": "dirichlet", "clients": 8, "alpha": 0.5},
        "federation": {
            "rounds": ROUNDS,
            "clients_per_round": 4,
            "batch_size": 64,
            "lr": 0.05,
            "momentum": 0.5,
        },
        "algorithm": {"name": "scaffold"},
    }
    spec = write_spec(tmp_path, "resume", **sections, runtime={**RUNTIME, "checkpoint_every": 4})
    # the reference runs without checkpoints: runtime settings never change a key
    uninterrupted = write_spec(
        tmp_path, "uninterrupted", **sections, runtime={**RUNTIME, "checkpoint_every": 1000}
    )
    key, store = train_key(spec), tmp_path / "killed"
    assert train_key(uninterrupted) == key
    partial = store / "train" / f"{key}.partial"
    command = [sys.executable, "-m", "fedhet", "train", str(spec), "--store", str(store)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while newest_checkpoint(partial) is None:
        assert proc.poll() is None, f"train ended before any checkpoint: {proc.stderr.read()}"
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not ArtifactStore(store).exists("train", key), "killed too late: the run had finished"
    checkpoint = zarr.open_group(newest_checkpoint(partial), mode="r")
    done = int(checkpoint.attrs["round"])
    assert 1 <= done < ROUNDS
    wall_before = checkpoint["metrics"]["wall_time"][:]

    code, _, err = fedhet(monkeypatch, capsys, *command[3:])  # run again, here
    assert code == 0, err
    assert not partial.exists()  # published: the checkpoints are gone
    ref_args = ["train", str(uninterrupted), "--store", str(tmp_path / "ref")]
    code, _, _ = fedhet(monkeypatch, capsys, *ref_args)
    assert code == 0
    resumed = ArtifactStore(store).open("train", key)
    reference = ArtifactStore(tmp_path / "ref").open("train", key)
    resumed_metrics, reference_metrics = (
        read_arrays(resumed, "metrics"),
        read_arrays(reference, "metrics"),
    )
    np.testing.assert_array_equal(resumed_metrics.pop("wall_time")[:done], wall_before)
    reference_metrics.pop("wall_time")
    assert resumed_metrics.keys() == reference_metrics.keys()
    for name, values in reference_metrics.items():
        assert len(values) == ROUNDS
        np.testing.assert_array_equal(resumed_metrics[name], values, err_msg=name)
    for name, values in read_arrays(reference["model"], "final").items():
        np.testing.assert_array_equal(np.asarray(resumed["model"]["final"][name][...]), values)


# --- divergence ---------------------------------------------------------------------------


def diverging_spec(folder: Path) -> Path:
    return write_spec(
        folder,
        "diverge",
        model={"arch": "simple_cnn", "channels": [4, 8], "fc_width": 16},
        federation={"rounds": 4, "batch_size": 32, "lr": 1000.0},
    )


def test_a_diverging_run_exits_1_naming_round_and_client(tmp_path, monkeypatch, capsys):
    spec = diverging_spec(tmp_path)
    code, _, err = fedhet(monkeypatch, capsys, "train", str(spec), "--store", str(tmp_path))
    assert code == 1
    message = " ".join(err[err.index("error: ") :].split())
    found = re.match(r"error: round (\d+): client (\d+): loss became (nan|inf)", message)
    assert found, message
    assert "Traceback" not in err
    failed_round = int(found.group(1))
    key = train_key(spec)
    assert not ArtifactStore(tmp_path).exists("train", key)
    (checkpoint,) = (tmp_path / "train" / f"{key}.partial").glob("ckpt-*.zarr")
    kept = zarr.open_group(checkpoint, mode="r")
    assert kept.attrs["round"] == failed_round - 1
    accuracy = kept["metrics"]["test_accuracy"][:]
    assert len(accuracy) == failed_round - 1 and np.all(np.isfinite(accuracy))


def test_run_errors_print_on_one_line_however_long(tmp_path, monkeypatch, capsys):
    """The error names a path in the store, so it is long; it must still be one line."""
    spec = diverging_spec(tmp_path)
    code, _, err = fedhet(monkeypatch, capsys, "train", str(spec), "--store", str(tmp_path))
    assert code == 1
    assert err.rstrip("\n").splitlines()[-1].startswith("error: round "), err


# --- eval and report ----------------------------------------------------------------------


def test_eval_json_reports_global_per_class_per_client_and_cgv(tmp_path, monkeypatch, capsys):
    spec = write_spec(tmp_path, "evaluate")
    args = ["eval", str(spec), "--store", str(tmp_path), "--json", "--cgv", "--train"]
    code, out, _ = fedhet(monkeypatch, capsys, *args)
    assert code == 0
    (report,) = json.loads(out)
    digits = load_dataset("digits")
    counts = np.bincount(digits.test_y.numpy(), minlength=10)
    assert len(report["per_class_pct"]) == 10 and len(report["per_client_pct"]) == 4
    # the global accuracy is the class-size-weighted mean of the per-class accuracies
    weighted = float(np.dot(report["per_class_pct"], counts) / counts.sum())
    assert report["accuracy_pct"] == pytest.approx(weighted, abs=1e-4)  # in percent
    per_client = report["per_client_pct"]
    assert 30 < report["accuracy_pct"] <= 100 and all(0 <= a <= 100 for a in per_client)
    cgv = report["cgv"]
    assert cgv["total"] > 0
    assert cgv["features"] + cgv["head"] == pytest.approx(cgv["total"], rel=1e-9)
    code, text, _ = fedhet(monkeypatch, capsys, "eval", str(spec), "--store", str(tmp_path))
    assert code == 0 and "per class" in text and "CGV" not in text


@pytest.mark.parametrize("name", ["fedbn", "silobn"])
def test_eval_of_a_personalized_run_scores_the_clients_own_models(
    tmp_path, monkeypatch, capsys, name
):
    """FedBN/SiloBN: eval's accuracy is training's last-round accuracy (the mean over the
    clients' models), not the accuracy of the server's never-trained BN entries."""
    spec = write_spec(
        tmp_path,
        name,
        model={"arch": "mlp", "hidden": [16], "norm": "batch"},
        federation={"rounds": 3, "batch_size": 32, "lr": 0.1, "local_steps": 5},
        algorithm={"name": name},
    )
    args = ["eval", str(spec), "--store", str(tmp_path), "--json", "--train"]
    code, out, _ = fedhet(monkeypatch, capsys, *args)
    assert code == 0
    (report,) = json.loads(out)
    (run,) = runs_of(load_spec(spec))
    group = ArtifactStore(tmp_path).open("train", run.node.key)
    assert group["model"]["clients"]["ids"][:].tolist() == [0, 1, 2, 3]
    trained = float(group["metrics"]["test_accuracy"][-1])
    assert report["accuracy_pct"] == pytest.approx(100 * trained, abs=1e-4)
    per_client = report["per_client_pct"]
    assert len(per_client) == 4 and all(0 <= a <= 100 for a in per_client)


def test_report_of_a_2x2_matrix_writes_the_table_and_curves(tmp_path, monkeypatch, capsys):
    spec = write_spec(
        tmp_path,
        "grid",
        model={"arch": "mlp", "hidden": []},
        federation={"rounds": 2, "batch_size": 64, "lr": 0.1},
        eval={"target_accuracy": 0.2},
        matrix={
            "algorithm": [{"name": "fedavg"}, {"name": "fedprox", "mu": 0.1}],
            "partition": [
                {"scheme": "iid", "clients": 3},
                {"scheme": "classes", "clients": 3, "classes_per_client": 4},
            ],
        },
    )
    out_dir = tmp_path / "reports"
    args = ["report", str(spec), "--store", str(tmp_path / "store"), "--out", str(out_dir)]
    code, _, _ = fedhet(monkeypatch, capsys, *args, "--train")
    assert code == 0
    lines = (out_dir / "grid.md").read_text().splitlines()
    tables = markdown_tables(lines)
    accuracy, rounds, speedup, *paired, plateau, heterogeneity, cost, stages, _ = tables
    assert len(paired) == 5  # best, final, last tenth, all rounds, rounds to target
    assert plateau[0][:3] == ["algorithm", "setting", "rounds compared"]
    assert heterogeneity[0][:3] == ["partition", "clients", "Hellinger"]
    assert [row[1] for row in heterogeneity[2:]] == ["3", "3"]  # a row per partition
    assert accuracy[0] == rounds[0] == speedup[0] == ["algorithm", "iid", "#C=4"]
    assert stages[0] == ["algorithm", "setting", "seeds", "partition s", "train s", "total s"]
    best_cells = {row[0]: row[1:] for row in accuracy[2:]}
    round_cells = {row[0]: row[1:] for row in rounds[2:]}
    speedup_cells = {row[0]: row[1:] for row in speedup[2:]}
    fedavg_best = {}
    cost_rows = {(row[0], row[1]): row[3:] for row in cost[2:]}
    assert [row[2] for row in cost[2:]] == ["1"] * 4  # seeds per group
    assert list(best_cells) == ["FedAvg", "FedProx"] and len(cost_rows) == 4
    store = ArtifactStore(tmp_path / "store")
    for run in runs_of(load_spec(spec)):
        column = ["iid", "#C=4"].index(run.setting_label)
        metrics = store.open("train", run.node.key)["metrics"]
        accuracies = metrics["test_accuracy"][:]
        best = f"{100 * np.nanmax(accuracies):.2f} (n=1)"
        assert best_cells[run.algorithm_label][column] == best
        reached = [i + 1 for i, a in enumerate(accuracies) if a >= 0.2]
        assert round_cells[run.algorithm_label][column] == f"{float(reached[0]):.1f} (1/1)"
        if run.algorithm_label == "FedAvg":  # the reference: rounds to its own best
            fedavg_best[column] = np.nanmax(accuracies)
            best_round = float(np.nanargmax(accuracies) + 1)
            assert speedup_cells["FedAvg"][column] == f"{best_round:.1f} (1/1)"
        else:
            reached = [i + 1 for i, a in enumerate(accuracies) if a >= fedavg_best[column]]
            expected = f"{float(reached[0]):.1f} (1/1)" if reached else "never (0/1)"
            assert speedup_cells[run.algorithm_label][column] == expected
        seconds, relative, up, down, trips = cost_rows[run.algorithm_label, run.setting_label]
        assert up == f"{np.mean(metrics['bytes_up'][:]) / 1e6:.3f}" and trips == "1.0"
        assert seconds == f"{np.mean(metrics['wall_time'][1:]):.3f}"  # after the first round
        assert relative == "1.00" if run.algorithm_label == "FedAvg" else float(relative) > 0
    assert (out_dir / "grid.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert_curves_drawn(out_dir / "grid.png", panels=(2, 2))


def assert_curves_drawn(png: Path, panels: tuple[int, int]) -> None:
    """Every panel of the curves figure holds line pixels of matplotlib's first two colours
    (the two algorithms; the legend alone would not put them in every panel)."""
    image = imread(png)[..., :3]
    lines = np.zeros(image.shape[:2], dtype=bool)
    for colour in ("#1f77b4", "#ff7f0e"):
        lines |= np.all(np.abs(image - to_rgb(colour)) < 0.05, axis=-1)
    rows, columns = panels
    for band in np.array_split(lines, rows, axis=0):
        for panel in np.array_split(band, columns, axis=1):
            assert panel.sum() > 50, f"an empty panel in {png}"


def learning_rate_matrix(folder: Path, rates: list[float]) -> Path:
    """A matrix over federation.lr; 1000.0 diverges."""
    return write_spec(
        folder,
        "unstable",
        model={"arch": "simple_cnn", "channels": [4, 8], "fc_width": 16},
        federation={"rounds": 3, "batch_size": 32, "lr": 0.05},
        matrix={"federation.lr": rates},
    )


def test_report_keeps_a_diverged_run_as_a_marked_result(tmp_path, monkeypatch, capsys):
    spec = learning_rate_matrix(tmp_path, [0.05, 1000.0])
    out_dir = tmp_path / "reports"
    args = ["report", str(spec), "--store", str(tmp_path / "store"), "--out", str(out_dir)]
    code, _, err = fedhet(monkeypatch, capsys, *args, "--train")
    assert code == 0 and "loss became" in err
    text = (out_dir / "unstable.md").read_text()
    accuracy = markdown_tables(text.splitlines())[0]
    assert accuracy[0] == ["algorithm", "lr=0.05", "lr=1000.0"]
    stable, unstable = accuracy[2][1:]
    assert "†" not in stable and unstable.endswith("† 1/1")
    per_run = markdown_tables(text.splitlines())[-1]
    (diverged,) = [row for row in per_run[2:] if row[4].startswith("diverged in round ")]
    assert diverged[1] == "lr=1000.0"
    # a divergence is a result: without --train the report reads it from the run's checkpoint
    # area (the divergence recorded there) and writes the same report, training nothing
    (out_dir / "unstable.md").unlink()
    code_stored, _, err = fedhet(monkeypatch, capsys, *args)
    assert code_stored == 0 and "computing" not in err and "resuming" not in err
    assert (out_dir / "unstable.md").read_text() == text
    code_again, _, _ = fedhet(monkeypatch, capsys, *args, "--train")  # the same result again
    assert code_again == 0 and (out_dir / "unstable.md").read_text() == text


def test_train_goes_on_past_a_diverging_run_then_exits_1(tmp_path, monkeypatch, capsys):
    spec = learning_rate_matrix(tmp_path, [1000.0, 0.05])  # the diverging run first
    code, out, err = fedhet(monkeypatch, capsys, "train", str(spec), "--store", str(tmp_path))
    assert code == 1 and err.rstrip("\n").splitlines()[-1].startswith("error: round ")
    assert "diverged" in out
    stable = runs_of(load_spec(spec))[1]
    assert ArtifactStore(tmp_path).exists("train", stable.node.key)
