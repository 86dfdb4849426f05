"""The `pseudo` stage: FedBR's pseudo-data batch, computed once and shared by every run with
the same config.

RSM averages clients' (feature-shifted) samples, so its key has the partition upstream;
Mixture's stored part is the proxy dataset's RSM alone, independent of any partition.
The artifact holds `x` (N x C x H x W), `y` (N x classes, uniform), and for checking,
`source` (the pool each sample came from) and `members` (indices averaged within it).
Its node is planned by fedhet.methods.fedbr.config (pseudo_node).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import zarr

from fedhet.methods.fedbr.pseudo import draw, uniform_labels
from fedhet.plugin import (
    RunContext,
    Spec,
    StageNode,
    build_setup,
    create_array,
    load_data,
    stage,
    torch_generator,
)


def pools(
    kind: str, client_x: list[torch.Tensor], proxy: str | None, spec: Spec
) -> list[torch.Tensor]:
    """What RSM averages: every client's data, or the proxy dataset as a single pool."""
    if kind == "rsm":
        return client_x
    return [load_data(spec.data, proxy).train_x]


def round_generator(seed: int, rnd: int) -> torch.Generator:
    """Round r's pseudo batch; the stored artifact is round 0's."""
    return torch_generator(seed, "pseudo", rnd)


@stage("pseudo")
def run(node: StageNode, ctx: RunContext, out: zarr.Group, partial: Path) -> None:
    spec, config = ctx.spec, node.config
    ds = load_data(spec.data, seed=spec.seed)
    client_x = []
    if config["kind"] == "rsm":
        setup = build_setup(spec, ctx.upstream(node, "partition"))
        client_x = [c.x.cpu() for c in setup.clients]
    means = draw(
        config["kind"],
        pools(config["kind"], client_x, config.get("proxy"), spec),
        config["size"],
        config["subset"],
        ds.shape,
        round_generator(config["seed"], 0),
    )
    create_array(out, "x", data=means.x.numpy().astype(np.float32))
    create_array(out, "y", data=uniform_labels(len(means.x), ds.num_classes).numpy())
    create_array(out, "source", data=means.source.numpy().astype(np.int64))
    create_array(out, "members", data=means.members.numpy().astype(np.int64))


def load_pseudo(group: zarr.Group) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, soft labels) of a stored pseudo batch."""
    return torch.from_numpy(group["x"][...]), torch.from_numpy(group["y"][...])
