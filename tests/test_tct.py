"""TCT wired into fedhet: planning and keys, the entk and regress artifacts, reuse, bad input."""

from __future__ import annotations

import copy
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
import zarr

from fedhet.cli import main
from fedhet.core.errors import InputError, RunError
from fedhet.core.pipeline import STAGES, StageNode
from fedhet.core.spec import Spec, parse_spec
from fedhet.core.store import ArtifactStore
from fedhet.engine import tensors
from fedhet.engine.run_format import METRICS
from fedhet.engine.setup import build_setup
from fedhet.execution.planning import plan, runs_of
from fedhet.execution.results import execute
from fedhet.methods.tct import entk_stage
from fedhet.methods.tct.entk import entk_features_loop
from fedhet.methods.tct.entk_stage import FeatureWriter, convexified_model
from fedhet.methods.tct.regress_stage import load_splits
from fedhet.methods.tct.regression import solve
from fedhet.methods.tct.sections import EntkSpec

torch.set_num_threads(1)

T1, T2, P, CHUNK = 2, 3, 300, 64
BASE = {
    "name": "tct-test",
    "seed": 0,
    "data": {"dataset": "digits"},
    "partition": {"scheme": "classes", "clients": 5, "classes_per_client": 2},
    "model": {"arch": "simple_cnn", "channels": [3, 4], "fc_width": 8},
    "federation": {"rounds": T1 + T2, "local_steps": 3, "batch_size": 16, "lr": 0.05},
    "algorithm": {
        "name": "tct",
        "stage1": {"rounds": T1},
        "entk": {"subsample": P, "dtype": "fp32", "chunk": CHUNK},
        "stage2": {"rounds": T2, "local_steps": 20, "lr": 1e-3},
    },
    "runtime": {"threads": 1, "progress": False, "device": "cpu"},
}


def spec_data(**changes: object) -> dict:
    """BASE with dotted-path changes, e.g. spec_data(**{"algorithm.stage2.lr": 0.1})."""
    data = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = data
        for part in parents:
            node = node[part]
        node[leaf] = value
    return data


def make_spec(**changes: object) -> Spec:
    return parse_spec(spec_data(**changes))


def nodes(spec: Spec) -> dict[str, StageNode]:
    regress = plan(spec)
    entk = regress.upstream["entk"]
    bootstrap = entk.upstream["bootstrap"]
    return {"regress": regress, "entk": entk, "bootstrap": bootstrap}


def fedavg_spec(**federation: object) -> Spec:
    return make_spec(algorithm={"name": "fedavg"}, federation={**BASE["federation"], **federation})


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> ArtifactStore:
    """A store holding one complete TCT run of BASE."""
    st = ArtifactStore(tmp_path_factory.mktemp("store"))
    execute(runs_of(make_spec())[0], st)
    return st


def artifact(store: ArtifactStore, node: StageNode) -> zarr.Group:
    return store.open(node.stage, node.key)


# --- planning and keys ------------------------------------------------------------------


def test_bootstrap_is_the_train_node_of_the_plain_fedavg_spec() -> None:
    bootstrap = nodes(make_spec())["bootstrap"]
    assert bootstrap.stage == "train"
    assert bootstrap.key == plan(fedavg_spec(rounds=T1)).key
    # T1 defaults to what stage 2 leaves of federation.rounds
    unset = make_spec(**{"algorithm.stage1": {}})
    assert nodes(unset)["bootstrap"].key == bootstrap.key
    # stage-1 overrides are the federation settings of the equivalent FedAvg run
    overridden = make_spec(**{"algorithm.stage1": {"rounds": 4, "lr": 0.01, "local_steps": 7}})
    assert (
        nodes(overridden)["bootstrap"].key
        == plan(fedavg_spec(rounds=4, lr=0.01, local_steps=7)).key
    )


def test_each_stage_key_depends_on_its_own_settings_and_upstream_only() -> None:
    base = {name: node.key for name, node in nodes(make_spec()).items()}
    for stage2 in ({"lr": 5e-4}, {"rounds": 7}, {"local_steps": 9}, {"algorithm": "fedavg"}):
        changed = nodes(
            make_spec(**{"algorithm.stage2": {**BASE["algorithm"]["stage2"], **stage2}})
        )
        assert changed["bootstrap"].key == base["bootstrap"]
        assert changed["entk"].key == base["entk"]
        assert changed["regress"].key != base["regress"]
    for field, value in (("subsample", 200), ("seed", 1), ("dtype", "fp16"), ("chunk", 32)):
        changed = nodes(make_spec(**{f"algorithm.entk.{field}": value}))
        assert changed["bootstrap"].key == base["bootstrap"]
        assert changed["entk"].key != base["entk"]
        assert changed["regress"].key != base["regress"]
    changed = nodes(make_spec(**{"federation.lr": 0.1}))
    assert changed["bootstrap"].key != base["bootstrap"]


def test_labels_name_the_stage2_variant() -> None:
    assert make_spec().algorithm.label() == "TCT"
    assert (
        make_spec(**{"algorithm.stage2.algorithm": "gd"}).algorithm.label() == "TCT (stage 2 by gd)"
    )


# --- the entk artifact ------------------------------------------------------------------


def test_entk_features_are_the_per_sample_gradients_of_the_reinitialized_model(
    store: ArtifactStore,
) -> None:
    spec, chain = make_spec(), nodes(make_spec())
    features = artifact(store, chain["entk"])
    bootstrap = artifact(store, chain["bootstrap"])
    setup = build_setup(spec, store.open("partition", chain["bootstrap"].upstream["partition"].key))
    model = convexified_model(spec, setup, bootstrap, seed=0)
    trained = tensors.load(bootstrap["model"], "final")
    for name, value in model.state_dict().items():
        assert torch.equal(value, trained[name]) != name.startswith("head."), name

    mask = torch.from_numpy(features["mask"][:])
    assert mask.shape == (P,) and bool((mask[1:] > mask[:-1]).all())
    offsets = features["train/offsets"][:]
    assert offsets.tolist() == np.cumsum([0, *setup.sizes]).tolist()
    labels = features["train/labels"][:]
    assert labels.tolist() == torch.cat([c.y for c in setup.clients]).tolist()
    # rows of two clients and of the test set equal Algorithm 3's per-sample loop, same mask
    for client in (setup.clients[0], setup.clients[3]):
        start = int(offsets[client.id])
        stored = torch.from_numpy(features["train/features"][start : start + 5])
        reference = entk_features_loop(model, client.x[:5], mask)
        assert float((stored - reference).norm() / reference.norm()) < 1e-5
    stored = torch.from_numpy(features["test/features"][-5:])
    reference = entk_features_loop(model, setup.dataset.test_x[-5:], mask)
    assert float((stored - reference).norm() / reference.norm()) < 1e-5
    assert features["test/labels"][:].tolist() == setup.dataset.test_y.tolist()


def test_entk_normalization_statistics_are_the_global_train_moments(store: ArtifactStore) -> None:
    features = artifact(store, nodes(make_spec())["entk"])
    rows = features["train/features"][:].astype(np.float64)
    np.testing.assert_allclose(features["mean"][:], rows.mean(axis=0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(
        features["std"][:], np.maximum(rows.std(axis=0), 1e-6), rtol=1e-9, atol=1e-12
    )
    summary = features.attrs["normalization"]
    assert summary["samples"] == rows.shape[0]
    assert summary["constant_coordinates"] == int((rows.std(axis=0) <= 1e-6).sum())


def test_entk_streams_chunk_by_chunk(store: ArtifactStore, monkeypatch) -> None:
    """No block larger than `chunk` rows is ever computed; fp16 storage rounds the fp32 rows."""
    blocks: list[int] = []
    original = entk_stage.iter_entk_chunks

    def recording(model, x, coords, chunk):
        for block in original(model, x, coords, chunk):
            blocks.append(len(block))
            yield block

    monkeypatch.setattr(entk_stage, "iter_entk_chunks", recording)
    spec = make_spec(**{"algorithm.entk.chunk": 50, "algorithm.entk.dtype": "fp16"})
    execute(runs_of(spec)[0], store)
    half = artifact(store, nodes(spec)["entk"])
    full = artifact(store, nodes(make_spec())["entk"])
    n_train, n_test = full["train/labels"].shape[0], full["test/labels"].shape[0]
    assert max(blocks) == 50 and sum(blocks) == n_train + n_test
    assert half["train/features"].chunks == (50, P) and half["train/features"].dtype == np.float16
    assert full["train/features"].chunks == (CHUNK, P)
    np.testing.assert_allclose(
        half["train/features"][:].astype(np.float32),
        full["train/features"][:],
        rtol=1e-3,
        atol=1e-4,
    )


# --- the regress artifact ---------------------------------------------------------------


def test_regress_records_stage1_costs_then_stage2_quality(store: ArtifactStore) -> None:
    chain = nodes(make_spec())
    result, bootstrap = artifact(store, chain["regress"]), artifact(store, chain["bootstrap"])
    metrics = {name: arr[:] for name, arr in result["metrics"].arrays()}
    assert set(METRICS) | {"train_accuracy"} <= set(metrics)
    assert all(len(values) == T1 + T2 for values in metrics.values())
    for name in ("bytes_up", "bytes_down", "wall_time"):
        np.testing.assert_array_equal(metrics[name][:T1], bootstrap["metrics"][name][:])
    for name in ("test_accuracy", "test_loss", "train_loss", "train_accuracy"):
        assert np.isnan(metrics[name][:T1]).all() and np.isfinite(metrics[name][T1:]).all()
    clients, classes = 5, 10
    per_round = clients * (P + 1) * classes * 4
    assert metrics["bytes_up"][T1 + 1 :].tolist() == [per_round] * (T2 - 1)
    assert metrics["bytes_up"][T1] == per_round + clients * 2 * P * 8  # + normalization round
    assert result.attrs["stage1_rounds"] == T1


def test_regress_runs_the_configured_solver_and_reports_its_model(store: ArtifactStore) -> None:
    chain = nodes(make_spec())
    result, features = artifact(store, chain["regress"]), artifact(store, chain["entk"])
    clients, test = load_splits(features)
    # the splits are the stored features standardized with the stored statistics
    raw = features["test/features"][:].astype(np.float64)
    expected = (raw - features["mean"][:]) / features["std"][:]
    np.testing.assert_allclose(test.features.numpy(), expected, rtol=1e-5, atol=1e-5)

    reference = solve([(c.features, c.targets) for c in clients], "scaffold", T2, 20, 1e-3)
    train_loss = result["metrics"]["train_loss"][T1:]
    np.testing.assert_allclose(train_loss, reference.train_loss, rtol=1e-5)
    assert all(b < a for a, b in zip(train_loss[:-1], train_loss[1:], strict=False))
    weight, bias = result["linear"]["weight"][:], result["linear"]["bias"][:]
    np.testing.assert_allclose(weight, reference.weight.numpy(), rtol=1e-6, atol=1e-8)
    predicted = (expected @ weight + bias).argmax(axis=1)
    accuracy = float((predicted == features["test/labels"][:]).mean())
    assert result["metrics"]["test_accuracy"][-1] == pytest.approx(accuracy, abs=1e-9)
    assert accuracy > 0.5  # a 2-round bootstrap on digits already gives useful features


# --- reuse ------------------------------------------------------------------------------


def _fingerprint(store: ArtifactStore, node: StageNode) -> tuple[float, str]:
    path = store.path(node.stage, node.key) / "zarr.json"
    return path.stat().st_mtime_ns, store.open(node.stage, node.key).attrs["created"]


def test_changing_stage2_recomputes_only_regress(store: ArtifactStore, monkeypatch) -> None:
    chain = nodes(make_spec())
    upstream = [chain["bootstrap"], chain["bootstrap"].upstream["partition"], chain["entk"]]
    before = [_fingerprint(store, node) for node in upstream]

    def must_not_run(node, *args):
        raise AssertionError(f"{node.stage} was recomputed")

    for name in ("partition", "train", "entk"):
        monkeypatch.setitem(STAGES, name, must_not_run)
    spec = make_spec(**{"algorithm.stage2": {"rounds": 2, "local_steps": 5, "lr": 2e-3}})
    execute(runs_of(spec)[0], store)
    assert store.exists("regress", nodes(spec)["regress"].key)
    assert [_fingerprint(store, node) for node in upstream] == before
    # a plain FedAvg run of T1 rounds is the bootstrap: nothing to train either
    execute(runs_of(fedavg_spec(rounds=T1))[0], store)


# --- bad input, through the CLI ---------------------------------------------------------


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["fedhet", *args])
    try:
        main()
        code = 0
    except SystemExit as stop:
        code = stop.code
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def write_spec(path: Path, **changes: object) -> Path:
    path.write_text(yaml.safe_dump(spec_data(**changes)))
    return path


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"model": {"arch": "mlp", "hidden": []}}, "model.hidden"),
        ({"algorithm.entk.subsample": 0}, "algorithm.entk.subsample"),
        ({"algorithm.stage1": {}, "algorithm.stage2.rounds": T1 + T2}, "algorithm.stage1.rounds"),
    ],
)
def test_invalid_tct_specs_exit_2_naming_the_field(
    tmp_path: Path, monkeypatch, capsys, changes: dict, field: str
) -> None:
    path = write_spec(tmp_path / "bad.yaml", **changes)
    code, output = run_cli(monkeypatch, capsys, "spec", "hash", str(path))
    assert code == 2 and field in output and "Traceback" not in output
    with pytest.raises(InputError, match=field):
        plan(parse_spec(spec_data(**changes)))


def test_diverging_stage2_lr_exits_1_naming_the_round(
    store: ArtifactStore, tmp_path: Path, monkeypatch, capsys
) -> None:
    path = write_spec(tmp_path / "diverge.yaml", **{"algorithm.stage2.lr": 1e3})
    code, output = run_cli(monkeypatch, capsys, "train", str(path), "--store", str(store.root))
    found = re.search(r"diverged at round (\d+):", output)
    assert code == 1 and found
    whole_run_round = T1 + int(found[1])  # stage 2's round, counted in the whole run
    assert f"diverged {whole_run_round}/{T1 + T2}" in output
    assert "Traceback" not in output
    # a divergence is a result: the report reads it from the regress stage without training
    report = ["report", str(path), "--store", str(store.root), "--out", str(tmp_path / "r")]
    code, output = run_cli(monkeypatch, capsys, *report)
    assert code == 0, output
    text = (tmp_path / "r" / "tct-test.md").read_text()
    assert "† 1/1" in text and f"diverged in round {whole_run_round}" in text


def test_artifacts_show_lists_the_normalization_statistics(
    store: ArtifactStore, monkeypatch, capsys
) -> None:
    key = nodes(make_spec())["entk"].key
    code, output = run_cli(
        monkeypatch, capsys, "artifacts", "show", f"entk/{key[:16]}", "--store", str(store.root)
    )
    assert code == 0
    for expected in ("normalization", "std_median", "mean", "std", "train/features", "float32"):
        assert expected in output


@pytest.mark.parametrize(
    ("value", "fails"), [(65504.0, False), (65519.0, False), (65520.0, True), (math.nan, True)]
)
def test_feature_writer_refuses_values_the_storage_dtype_cannot_hold(value, fails) -> None:
    """fp16's largest value is 65504; 65519 still rounds to it, 65520 rounds to inf."""
    config = EntkSpec(subsample=4, dtype="fp16")
    writer = FeatureWriter(zarr.group(), "f", 3, config, p=4, moments=True)
    block = torch.ones(3, 4)
    block[1, 2] = value
    if fails:
        with pytest.raises(RunError, match=r"rows 0\.\.3 are not finite in torch.float16"):
            writer.write(block)
    else:
        writer.write(block)
        assert writer.moments.count == 3 and writer.array[1, 2] == 65504
