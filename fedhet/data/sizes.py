"""The check that a spec's partitions can give each client a training sample (`fedhet spec
validate` and every command that loads a spec refuse one that cannot, before anything is
allocated), from the size its dataset's config describes without loading it."""

from __future__ import annotations

from pathlib import Path

from fedhet.core.data_config import DataConfig
from fedhet.core.errors import InputError
from fedhet.core.spec import Spec, expand


def train_samples(data: DataConfig) -> int | None:
    """The dataset's training samples; None for a plug-in's that knows them once loaded."""
    return data.describe().train_samples


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
