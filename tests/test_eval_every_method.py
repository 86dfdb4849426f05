"""`fedhet eval` scores every method's final or best model with the same JSON fields: a network's
(FedAvg) and TCT's stage-2 linear model on the test eNTK features, which must reproduce the test
accuracy the regress stage recorded for that model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_SPEC, write_spec

from fedhet.core.spec import load_spec
from fedhet.core.store import ArtifactStore
from fedhet.data.datasets import load_dataset
from fedhet.execution.planning import runs_of

RUNTIME = {"threads": 1, "progress": False, "device": "cpu"}
BASE = {
    **TINY_SPEC,
    "partition": {"scheme": "classes", "clients": 5, "classes_per_client": 2},
    "model": {"arch": "mlp", "hidden": [8]},
    "federation": {"rounds": 6, "batch_size": 32, "lr": 0.05, "local_steps": 2},
    "runtime": RUNTIME,
}
TCT = {
    "name": "tct",
    "stage1": {"rounds": 2},
    "entk": {"subsample": 100, "dtype": "fp32"},
    "stage2": {"rounds": 4, "local_steps": 5, "lr": 1e-3},
}


@pytest.fixture(scope="module")
def trained(fedhet, tmp_path_factory) -> tuple[Path, Path]:
    """(spec, store): FedAvg and TCT on the same data, both trained."""
    folder = tmp_path_factory.mktemp("eval")
    spec = write_spec(
        folder / "spec.yaml", {**BASE, "matrix": {"algorithm": [{"name": "fedavg"}, TCT]}}
    )
    store = folder / "store"
    assert fedhet("train", spec, "--store", store).rc == 0
    return spec, store


def evaluations(fedhet, spec: Path, store: Path, *args: str) -> list[dict]:
    result = fedhet("eval", spec, "--json", "--store", store, *args)
    assert result.rc == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("model", ["final", "best"])
def test_every_method_reports_its_stored_models_test_accuracy(fedhet, trained, model):
    spec, store = trained
    reports = evaluations(fedhet, spec, store, "--model", model)
    fedavg, tct = reports
    assert fedavg.keys() == tct.keys() and tct["algorithm"] == "TCT" and tct["model"] == model
    counts = np.bincount(load_dataset("digits").test_y.numpy(), minlength=10)
    for run, report in zip(runs_of(load_spec(spec)), reports, strict=True):
        tested = ArtifactStore(store).open(run.node.stage, run.node.key)["metrics"]["test_accuracy"]
        recorded = tested[-1] if model == "final" else np.nanmax(tested[:])
        assert report["accuracy_pct"] == pytest.approx(100 * recorded, abs=1e-10)
        weighted = np.dot(report["per_class_pct"], counts) / counts.sum()
        assert report["accuracy_pct"] == pytest.approx(weighted, abs=1e-4)
        per_client = report["per_client_pct"]
        assert len(per_client) == 5 and all(0 <= a <= 100 for a in per_client)


def test_cgv_is_null_for_a_model_that_is_no_network(fedhet, trained):
    spec, store = trained
    fedavg, tct = evaluations(fedhet, spec, store, "--cgv")
    assert fedavg["cgv"]["total"] > 0 and tct["cgv"] is None
