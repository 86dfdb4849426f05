"""What a run trains on: the spec, the dataset, the clients' data and the device.

Every stage that needs the clients' data (train, TCT's entk, FedBR's pseudo) and `fedhet eval`
build it the same way, from the spec and the run's partition artifact: `build_setup` (which
also computes the partition in memory, for an engine built outside a store: tests, notebooks).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch
import zarr

from fedhet.core.errors import InputError
from fedhet.core.spec import Spec
from fedhet.data.client_test import client_test_indices, own_test_sets
from fedhet.data.clients import ClientData
from fedhet.data.datasets import Dataset, Interpolation, load_data, rotate
from fedhet.data.feature_shift import ClientDomains
from fedhet.data.partition import Partition
from fedhet.data.partition_format import load_index_lists, load_partition
from fedhet.data.partition_stage import spec_partition


@dataclass
class TrainSetup:
    """Everything fixed for a run: the spec, data, clients and device."""

    spec: Spec
    dataset: Dataset
    clients: list[ClientData]
    device: torch.device
    extras: dict[str, object] = field(default_factory=dict)  # artifacts of extra upstream stages
    # with `data.validation`: every client's held-out samples, pooled client after client (id -1)
    validation: ClientData | None = None
    # with `data.validation`: each client's held-out samples (its id), in client order
    held_out: list[ClientData] | None = None
    # for a personalized method with `eval.client_test`: each client's own test samples
    client_tests: list[ClientData] | None = None
    # with `data.server`: the training samples no client holds (id -2; FedDF's real server data)
    server: ClientData | None = None

    @property
    def sizes(self) -> list[int]:
        return [c.n for c in self.clients]

    @property
    def holders(self) -> list[int]:
        """Indices of the clients holding samples.

        A partition may leave a client empty (e.g. dirichlet with a small alpha). An empty
        client never trains: rounds sample among the holders only, so it is never sampled,
        has no aggregation weight (its share n_i / n is 0 anyway), no state and no statistics.
        With no empty client the holders are all clients and nothing changes.
        """
        return [cid for cid, client in enumerate(self.clients) if client.n > 0]

    @property
    def clients_per_round(self) -> int:
        """Clients trained per round: the spec's count, or every holder when fewer hold data."""
        return min(self.spec.clients_per_round, len(self.holders))


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError(
            "runtime.device: cuda requested but no CUDA device is available; use auto or cpu"
        )
    return torch.device(name)


def build_setup(
    spec: Spec,
    partition: zarr.Group | Partition | None = None,
    client_test: zarr.Group | None = None,
) -> TrainSetup:
    """Dataset, clients (with their feature shift applied) and device for a run; the clients
    of `partition`, the run's stored partition artifact or a Partition, by default the spec's
    computed here as its partition stage computes it. A personalized method with
    `eval.client_test` also gets each client's own test samples: those of `client_test`, the
    run's stored artifact, by default computed here as its stage computes them."""
    device = resolve_device(spec.runtime.device)
    ds = load_data(spec.data, seed=spec.seed)
    if partition is None:
        part = spec_partition(spec)
    elif isinstance(partition, Partition):
        part = partition
    else:
        part = load_partition(partition)
    domains = ClientDomains.of(spec, part.angles, ds)
    clients = [
        client_data(ds, domains, cid, idx, device) for cid, idx in enumerate(part.client_indices)
    ]
    validation, held = None, None
    if part.validation_indices is not None:
        held = [
            client_data(ds, domains, c, i, device, "validation")
            for c, i in enumerate(part.validation_indices)
        ]
        validation = ClientData(-1, torch.cat([h.x for h in held]), torch.cat([h.y for h in held]))
    client_tests = None
    if spec.algorithm.personalized and spec.eval.client_test is not None:
        if client_test is None:
            indices = client_test_indices(spec, part.histogram, ds)
        else:
            indices = load_index_lists(client_test)
        client_tests = own_test_sets(ds, domains, indices, device)
    server = None
    if part.server_indices is not None:  # as the dataset gives them: no client's feature shift
        idx = torch.from_numpy(part.server_indices)
        server = ClientData(-2, ds.train_x[idx].to(device), ds.train_y[idx].to(device))
    if domains.shifted:
        ds = replace(ds, test_x=domains.like_clients(ds.test_x))
    ds_device = ds if device.type == "cpu" else _to_device(ds, device)
    return TrainSetup(
        spec,
        ds_device,
        clients,
        device,
        validation=validation,
        held_out=held,
        server=server,
        client_tests=client_tests,
    )


def client_data(
    ds: Dataset,
    domains: ClientDomains,
    cid: int,
    idx: np.ndarray,
    device: torch.device,
    split: str = "train",
) -> ClientData:
    """Client `cid`'s training samples at `idx` (of `split`: train or validation), in its domain
    (its feature shift applied: fedhet.data.feature_shift)."""
    x = domains.apply(ds.train_x[torch.from_numpy(idx)], cid, split)
    return ClientData(cid, x.to(device), ds.train_y[torch.from_numpy(idx)].to(device))


def own_angle_test(
    ds: Dataset, part: Partition, interpolation: Interpolation = "bilinear"
) -> torch.Tensor:
    """The (unrotated) test images, each rotated by its class's own training angle: the angle
    of the client holding the most training samples of the class (the first of equals).

    Under a label skew with a rotation per client, each class is trained at about one angle while
    the test set shows it at every client's; this is the test set that matches training."""
    class_angles = part.angles[np.argmax(part.histogram, axis=0)]
    test_x = ds.test_x.clone()
    for label, degrees in enumerate(class_angles):
        members = ds.test_y == label
        if degrees != 0 and bool(members.any()):
            test_x[members] = rotate(
                test_x[members], float(degrees), ds.mean, ds.std, interpolation
            )
    return test_x


def _to_device(ds: Dataset, device: torch.device) -> Dataset:
    return replace(ds, test_x=ds.test_x.to(device), test_y=ds.test_y.to(device))
