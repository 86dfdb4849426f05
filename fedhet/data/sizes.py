"""The number of training samples of every registered dataset, known without loading it, and the
check that a spec's partitions can give each client one (`fedhet spec validate` and every
command that loads a spec refuse one that cannot, before anything is allocated).
tests/test_data.py checks the table against the loaded datasets."""

from __future__ import annotations

from pathlib import Path

from fedhet.core.data_config import DataConfig
from fedhet.core.errors import InputError
from fedhet.core.spec import DataSpec, Spec, expand

TRAIN_SAMPLES: dict[str, int] = {
    "digits": 1438,  # 1797 less the stratified 20% test split of fedhet.data.datasets
    "mnist": 60_000,
    "fmnist": 60_000,
    "emnist": 112_800,  # the balanced split
    "cifar10": 50_000,
    "cifar100": 50_000,
    "svhn": 73_257,
}


def train_samples(data: DataSpec) -> int | None:
    """The dataset's training samples; None for a plug-in's that knows them once loaded."""
    if isinstance(data, DataConfig):
        return data.describe().train_samples
    return TRAIN_SAMPLES[data.dataset]


def require_a_sample_per_client(spec: Spec, where: Path) -> None:
    """Refuse a spec any of whose runs has more clients than its dataset has training samples."""
    for _, run in expand(spec):
        clients, dataset = run.partition.clients, run.data.dataset
        samples = train_samples(run.data)
        if samples is not None and clients > samples:
            raise InputError(
                f"{where}: partition.clients: {clients} clients for the {samples} training "
                f"samples of {dataset}, so some would hold none; give at most {samples} clients"
            )
