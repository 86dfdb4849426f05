"""TensorBoard events: written live by training (`runtime.tensorboard`) and by `fedhet export
--tensorboard` from stored runs, read back with TensorBoard's own event reader: the same scalars
either way, equal to the stored metrics, with each round's learning rate."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_SPEC, write_spec
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedhet.core.spec import load_spec
from fedhet.core.store import ArtifactStore
from fedhet.engine.tensorboard import RUN, run_folder
from fedhet.execution.planning import runs_of

RUNTIME = {"threads": 1, "progress": False, "device": "cpu"}
MATRIX = {
    **TINY_SPEC,
    "federation": {"rounds": 3, "batch_size": 64, "lr": 0.05, "lr_decay": 0.9, "local_steps": 2},
    "eval": {"every": 2},
    "matrix": {"algorithm.name": ["fedavg", "scaffold"]},
}
TCT = {
    **TINY_SPEC,
    "partition": {"scheme": "classes", "clients": 5, "classes_per_client": 2},
    "model": {"arch": "mlp", "hidden": [8]},
    "federation": {"rounds": 4, "batch_size": 32, "lr": 0.05, "local_steps": 2},
    "algorithm": {
        "name": "tct",
        "stage1": {"rounds": 2},
        "entk": {"subsample": 100, "dtype": "fp32"},
        "stage2": {"rounds": 2, "local_steps": 5, "lr": 1e-3},
    },
}


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(folder))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def train_live(fedhet, folder: Path, raw: dict) -> tuple[Path, Path, Path]:
    """(spec, store, live events folder) after `fedhet train` with runtime.tensorboard."""
    live = folder / "live"
    runtime = {**RUNTIME, "tensorboard": str(live)}
    spec = write_spec(folder / "spec.yaml", {**raw, "runtime": runtime})
    store = folder / "store"
    result = fedhet("train", spec, "--store", store)
    assert result.rc == 0, result.stderr
    return spec, store, live


def check_live_equals_export(fedhet, spec: Path, store: Path, live: Path, tmp: Path) -> list:
    """Export the events of the stored runs, compare with the live ones and the stored metrics;
    each run's exported scalars."""
    exported = tmp / "exported"
    assert fedhet("export", spec, "--tensorboard", exported, "--store", store).rc == 0
    found = []
    for run in runs_of(load_spec(spec)):
        written = scalars(run_folder(exported, run.label))
        assert scalars(run_folder(live, run.label)) == written
        metrics = ArtifactStore(store).open(run.node.stage, run.node.key)["metrics"]
        for name, array in metrics.arrays():
            # in the unit of every table, named with it: accuracies in percent as `_pct`,
            # a round's seconds as `_s`
            percent = name.endswith("accuracy")
            tag = f"{name}_pct" if percent else f"{name}_s" if name == "wall_time" else name
            shown = 100 * array[:] if percent else array[:]
            expected = [(r + 1, v) for r, v in enumerate(shown) if not math.isnan(v)]
            steps, values = zip(*written.get(tag, []), strict=True) if expected else ((), ())
            assert list(steps) == [step for step, _ in expected], name
            np.testing.assert_allclose(values, [v for _, v in expected], rtol=1e-6)  # float32
        assert "test_accuracy" not in written and written["test_accuracy_pct"]
        assert "wall_time" not in written and written["wall_time_s"]
        found.append(written)
    return found


def test_live_and_exported_events_are_the_stored_metrics(fedhet, tmp_path):
    spec, store, live = train_live(fedhet, tmp_path, MATRIX)
    for written in check_live_equals_export(fedhet, spec, store, live, tmp_path):
        steps, rates = zip(*written["learning_rate"], strict=True)
        assert steps == (1, 2, 3)
        np.testing.assert_allclose(rates, [0.05, 0.05 * 0.9, 0.05 * 0.81], rtol=1e-6)
        assert [step for step, _ in written["test_accuracy_pct"]] == [2, 3]  # evaluated only
        assert all(1 < value <= 100 for _, value in written["test_accuracy_pct"])  # not 0-1


def test_tct_events_cover_both_stages_with_their_learning_rates(fedhet, tmp_path):
    spec, store, live = train_live(fedhet, tmp_path, TCT)
    (written,) = check_live_equals_export(fedhet, spec, store, live, tmp_path)
    np.testing.assert_allclose([v for _, v in written["learning_rate"]], [0.05] * 2 + [1e-3] * 2)
    assert [step for step, _ in written["test_accuracy_pct"]] == [3, 4]  # stage 2 only
    (run,) = runs_of(load_spec(spec))
    assert [folder.name for folder in live.iterdir()] == [run_folder(live, run.label).name]


def test_an_unwritable_tensorboard_folder_exits_2_before_training(fedhet, tmp_path):
    (tmp_path / "a-file").write_text("")
    runtime = {**RUNTIME, "tensorboard": str(tmp_path / "a-file" / "events")}
    spec = write_spec(tmp_path / "spec.yaml", {**TINY_SPEC, "runtime": runtime})
    result = fedhet("train", spec, "--store", tmp_path / "store")
    assert result.rc == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "runtime.tensorboard" in result.stderr
    assert not (tmp_path / "store").exists()


@pytest.fixture(autouse=True)
def _quiet_tensorboard_logs(caplog):
    caplog.set_level("ERROR", logger="tensorboard")


def test_run_folders_are_safe_names_and_the_events_hold_the_label(fedhet, tmp_path):
    spec = write_spec(tmp_path / "spec.yaml", {**MATRIX, "runtime": RUNTIME})
    assert fedhet("train", spec, "--store", tmp_path / "store").rc == 0
    exported = fedhet(
        "export", spec, "--tensorboard", tmp_path / "tb", "--store", tmp_path / "store"
    )
    assert exported.rc == 0, exported.stderr
    runs = runs_of(load_spec(spec))
    folders = sorted(p.name for p in (tmp_path / "tb").iterdir())
    assert [run.label for run in runs] == [
        "FedAvg, alpha=0.5, seed 3",
        "SCAFFOLD, alpha=0.5, seed 3",
    ]
    assert folders == ["FedAvg_alpha=0.5_seed_3", "SCAFFOLD_alpha=0.5_seed_3"]
    for run in runs:
        events = EventAccumulator(str(run_folder(tmp_path / "tb", run.label)))
        events.Reload()
        (label,) = events.Tensors(f"{RUN}/text_summary")
        assert label.tensor_proto.string_val == [run.label.encode()]
