"""`data.validation`: the held-out split (stratified, seeded, disjoint), that no method trains on
it, best-model selection by validation accuracy (engine, summary, TCT stage 2), unchanged keys
without it, and `fedhet train` / `fedhet report` with it end to end."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
import zarr
from conftest import CliResult, CliRunner

from fedhet.core.errors import InputError
from fedhet.core.pipeline import RunContext, ensure
from fedhet.core.spec import parse_spec
from fedhet.core.store import ArtifactStore
from fedhet.data.datasets import load_dataset
from fedhet.data.partition import make_partition
from fedhet.data.partition_format import load_partition
from fedhet.data.partition_plan import partition_node
from fedhet.data.validation import held_out_count, hold_out
from fedhet.engine.loop import Checkpoints, Engine, evaluate
from fedhet.engine.run_format import METRICS
from fedhet.engine.setup import build_setup
from fedhet.engine.trainer import Trainer
from fedhet.execution.planning import plan, runs_of
from fedhet.execution.results import execute
from fedhet.methods.centralized.algorithm import Centralized
from fedhet.methods.tct.regress_stage import fit_quality, load_validation
from fedhet.metrics.summary import summarize, validated

torch.set_num_threads(1)
DIGITS = load_dataset("digits")
LABELS = DIGITS.train_y.numpy()
RUNTIME = {"threads": 1, "progress": False, "device": "cpu"}


def spec_data(validation: float | None = 0.2, **sections) -> dict:
    raw = {
        "name": "validation-test",
        "seed": 3,
        "data": {"dataset": "digits", "validation": validation},
        "partition": {"scheme": "dirichlet", "clients": 5, "alpha": 0.5},
        "model": {"arch": "mlp", "hidden": [16]},
        "federation": {"rounds": 4, "batch_size": 64, "lr": 0.05},
        "runtime": RUNTIME,
        **sections,
    }
    if validation is None:
        raw["data"] = {"dataset": "digits"}
    return raw


def partition_group(spec, store: ArtifactStore) -> zarr.Group:
    return ensure(partition_node(spec), RunContext(spec, store))


# --- the split ----------------------------------------------------------------------------


def dirichlet(seed: int = 3):
    spec = parse_spec(spec_data(None))
    return make_partition(spec.partition, LABELS, DIGITS.num_classes, seed)


@pytest.mark.parametrize("fraction", [0.1, 0.2, 0.5])
def test_each_client_holds_out_its_rounded_share_of_every_class(fraction):
    whole = dirichlet()
    split = hold_out(whole, LABELS, fraction, seed=3)
    for cid, indices in enumerate(whole.client_indices):
        kept, held = split.client_indices[cid], split.validation_indices[cid]
        assert np.intersect1d(kept, held).size == 0
        assert np.array_equal(np.sort(np.concatenate([kept, held])), indices)
        for c, n_c in enumerate(np.bincount(LABELS[indices], minlength=DIGITS.num_classes)):
            assert (LABELS[held] == c).sum() == held_out_count(fraction, n_c)
            assert abs((LABELS[held] == c).sum() - fraction * n_c) <= 0.5
        assert np.array_equal(split.histogram[cid], np.bincount(LABELS[kept], minlength=10))


def test_rounding_is_half_up_and_a_small_class_may_give_nothing():
    assert [held_out_count(0.2, n) for n in range(8)] == [0, 0, 0, 1, 1, 1, 1, 1]
    assert held_out_count(0.5, 1) == 1 and held_out_count(0.25, 2) == 1


def test_the_split_is_seeded_per_client():
    whole = dirichlet()
    first, again = hold_out(whole, LABELS, 0.3, 3), hold_out(whole, LABELS, 0.3, 3)
    other = hold_out(whole, LABELS, 0.3, 4)
    held = [split.validation_indices for split in (first, again, other)]
    same = [np.array_equal(a, b) for a, b in zip(held[0], held[1], strict=True)]
    changed = [np.array_equal(a, b) for a, b in zip(held[0], held[2], strict=True)]
    assert all(same) and not all(changed)


def test_the_partition_artifact_stores_both_and_setup_trains_on_the_kept_samples(tmp_path):
    spec = parse_spec(spec_data(0.25))
    part = load_partition(partition_group(spec, ArtifactStore(tmp_path)))
    expected = hold_out(dirichlet(spec.seed), LABELS, 0.25, spec.seed)
    for mine, theirs in [(part.client_indices, expected.client_indices),
                         (part.validation_indices, expected.validation_indices)]:  # fmt: skip
        assert all(np.array_equal(a, b) for a, b in zip(mine, theirs, strict=True))
    setup = build_setup(spec, partition_group(spec, ArtifactStore(tmp_path)))
    for client, kept in zip(setup.clients, part.client_indices, strict=True):
        assert torch.equal(client.x, DIGITS.train_x[torch.from_numpy(kept)])
    held = np.concatenate(part.validation_indices)
    assert torch.equal(setup.validation.x, DIGITS.train_x[torch.from_numpy(held)])
    assert torch.equal(setup.validation.y, DIGITS.train_y[torch.from_numpy(held)])
    assert sum(setup.sizes) + setup.validation.n == len(LABELS)


# --- keys ---------------------------------------------------------------------------------


def test_without_the_option_nothing_changes_and_with_it_every_stage_key_does():
    off = parse_spec(spec_data(None))
    assert "validation" not in off.model_dump(mode="json")["data"]
    assert "validation" not in partition_node(off).config
    on = parse_spec(spec_data(0.2))
    assert partition_node(on).config["validation"] == 0.2
    assert plan(on).key != plan(off).key
    assert partition_node(on).key != partition_node(off).key


@pytest.mark.parametrize("fraction", [0, 1, -0.1, 1.5])
def test_a_fraction_outside_0_1_is_refused(fraction):
    with pytest.raises(InputError, match="data.validation"):
        parse_spec(spec_data(fraction))


# --- no method trains on held-out samples -------------------------------------------------


def counting(base: type[Trainer]) -> type[Trainer]:
    """`base` that records the labels of every sample its clients train on, per round."""

    class Counting(base):
        def __init__(self, config, setup):
            super().__init__(config, setup)
            self.trained: dict[int, int] = defaultdict(int)

        def client_batches(self, job):
            for idx in super().client_batches(job):
                self.trained[job.round] += len(idx)
                assert job.client.n == len(job.client.y)
                yield idx

    return Counting


@pytest.mark.parametrize(("name", "base"), [("fedavg", Trainer), ("centralized", Centralized)])
def test_one_epoch_trains_every_kept_sample_once_and_no_held_out_one(tmp_path, name, base):
    spec = parse_spec(spec_data(0.3, algorithm={"name": name}))
    engine = Engine.from_spec(spec, tmp_path, trainer=counting(base))
    setup = engine.setup
    kept = sum(setup.sizes)
    engine.run()
    # one local epoch of every client (all sampled) = the kept samples, never the held-out ones
    assert dict(engine.algorithm.trained) == dict.fromkeys(range(4), kept)
    assert kept == len(LABELS) - setup.validation.n


# --- selection ----------------------------------------------------------------------------


def test_summary_reports_the_test_accuracy_at_the_best_validation_round():
    metrics = {
        "test_accuracy": [math.nan, 0.9, 0.7, 0.6, 0.8],
        "val_accuracy": [math.nan, 0.5, 0.8, 0.8, 0.7],
        **{name: [0.0] * 5 for name in ("bytes_up", "bytes_down", "wall_time")},
    }
    chosen = summarize(metrics)
    # the first of equals; each quantity under its own name, never one label for two
    assert (chosen["best_val_round"], chosen["test_at_best_val"]) == (3, 0.7)
    assert chosen["best_val"] == 0.8 and chosen["final"] == 0.8
    assert (chosen["best_test_round"], chosen["best_test"]) == (2, 0.9)
    plain = summarize({k: v for k, v in metrics.items() if k != "val_accuracy"})
    assert (plain["best_test_round"], plain["best_test"]) == (2, 0.9)
    assert "test_at_best_val" not in plain
    assert validated([chosen]) and not validated([plain])


def test_the_engine_keeps_the_model_of_the_best_validation_round(tmp_path):
    spec = parse_spec(spec_data(0.3, federation={"rounds": 6, "batch_size": 64, "lr": 0.2}))
    engine = Engine.from_spec(spec, tmp_path)
    setup, state = engine.setup, engine.run()
    metrics = state.metrics
    assert set(metrics) == {*METRICS, "val_accuracy", "val_loss"}
    best = int(np.argmax(metrics["val_accuracy"]))
    engine.model.load_state_dict(state.best_state)
    val = evaluate(engine.model, setup.validation.x, setup.validation.y)
    test = evaluate(engine.model, DIGITS.test_x, DIGITS.test_y)
    assert val == (metrics["val_accuracy"][best], metrics["val_loss"][best])
    assert test[0] == metrics["test_accuracy"][best] == summarize(metrics)["test_at_best_val"]


def test_a_run_resumed_from_a_checkpoint_keeps_its_validation_metrics_and_choice(tmp_path):
    federation = {"rounds": 4, "batch_size": 64, "lr": 0.2}
    every_2 = {**RUNTIME, "checkpoint_every": 2}
    spec = parse_spec(spec_data(0.3, federation=federation, runtime=every_2))
    whole = Engine.from_spec(spec, tmp_path / "a").run()
    saved = Checkpoints(tmp_path / "a").latest()  # round 2's checkpoint
    assert saved.round == 2 and saved.metrics["val_accuracy"] == whole.metrics["val_accuracy"][:2]
    resumed = Engine.from_spec(spec, tmp_path / "b").run(saved)
    assert resumed.metrics["val_accuracy"] == whole.metrics["val_accuracy"]
    assert resumed.best_accuracy == whole.best_accuracy == max(whole.metrics["val_accuracy"])


def test_without_a_split_the_run_stores_exactly_the_usual_metrics(tmp_path):
    spec = parse_spec(spec_data(None, federation={"rounds": 1}))
    engine = Engine.from_spec(spec, tmp_path)
    assert engine.setup.validation is None
    state = engine.run()
    assert tuple(state.metrics) == METRICS


TCT = {
    "partition": {"scheme": "classes", "clients": 5, "classes_per_client": 2},
    "model": {"arch": "simple_cnn", "channels": [3, 4], "fc_width": 8},
    "federation": {"rounds": 6, "local_steps": 3, "batch_size": 16, "lr": 0.05},
    "algorithm": {
        "name": "tct",
        "stage1": {"rounds": 2},
        "entk": {"subsample": 300, "dtype": "fp32", "chunk": 64},
        "stage2": {"rounds": 4, "local_steps": 20, "lr": 1e-3},
    },
}


def test_tct_stage_2_fits_the_kept_samples_and_selects_by_validation(tmp_path):
    spec = parse_spec(spec_data(0.2, **TCT))
    store = ArtifactStore(tmp_path)
    regress = execute(runs_of(spec)[0], store)
    entk_node = plan(spec).upstream["entk"]
    entk = store.open("entk", entk_node.key)
    part = load_partition(store.open("partition", partition_node(spec).key))
    assert entk["train/offsets"][-1] == sum(len(i) for i in part.client_indices)
    held = np.concatenate(part.validation_indices)
    assert np.array_equal(entk["validation/labels"][:], LABELS[held])
    metrics = {name: values[:].tolist() for name, values in regress["metrics"].arrays()}
    stage2 = metrics["val_accuracy"][2:]
    assert all(math.isnan(v) for v in metrics["val_accuracy"][:2]) and len(stage2) == 4
    weight = torch.from_numpy(regress["linear/best/weight"][:])
    bias = torch.from_numpy(regress["linear/best/bias"][:])
    assert fit_quality([load_validation(entk)], weight, bias)[0] == max(stage2)
    summary = regress.attrs["summary"]
    assert summary["test_at_best_val"] == metrics["test_accuracy"][2 + int(np.argmax(stage2))]


# --- the CLI ------------------------------------------------------------------------------


def test_train_with_a_validation_split_and_the_report_labels_the_selection(
    fedhet: CliRunner, tmp_path: Path
):
    raw = spec_data(None, federation={"rounds": 3, "batch_size": 64, "lr": 0.05})
    raw["matrix"] = {"algorithm": [{"name": "fedavg"}, {"name": "centralized"}]}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    store, out = tmp_path / "store", tmp_path / "report"

    def run(*args: str) -> CliResult:
        return fedhet(*args, "--store", store, cwd=tmp_path)

    trained = run("train", str(path), "data.validation=0.2")
    assert trained.rc == 0, trained.stderr
    reported = run("report", str(path), "data.validation=0.2", "--out", str(out))
    assert reported.rc == 0, reported.stderr
    text = (out / f"{raw['name']}.md").read_text()
    # each quantity under its own name: best test, test at the best validation round, final
    assert "## Test accuracy at the best validation round" in text
    assert "### Test accuracy at the best validation round" in text
    assert "### Best test accuracy" in text and "### Final test accuracy" in text
    assert "| best test % | test at best val % | final test % |" in text
    trained_table = trained.stdout
    assert "best test %" in trained_table and "test at best val %" in trained_table
    refused = run("train", str(path), "data.validation=1")
    assert refused.rc == 2 and "data.validation" in refused.stderr
    assert "Traceback" not in refused.stderr
