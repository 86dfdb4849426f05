"""The `entk` stage (TCT's convexify step): eNTK features of all clients' samples and the test set.

The bootstrapped model's head is re-initialized with a seed, and each sample's feature is
the gradient of the first logit with respect to every trainable parameter, restricted to a
seeded mask of p coordinates that train and test share (fedhet.methods.tct.entk). Features are
streamed chunk by chunk into Zarr, so peak memory is bounded by `chunk`, not by the data.

Artifact layout:
    train/features [N, p]  every client's samples, client after client (`chunk` rows a chunk)
    train/labels [N], train/offsets [K + 1]  client k owns rows offsets[k]:offsets[k + 1]
    test/features [M, p], test/labels [M]
    validation/features [V, p], validation/labels [V]  with `data.validation`: the samples the
                  clients hold out (never in train/, so stage 2 never fits them), pooled
    mask [p]      the kept coordinates of the flattened parameters
    mean, std [p] the global per-coordinate statistics of the train features (the
                  normalization round); attrs["normalization"] summarizes them
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import zarr
from torch import Tensor, nn

from fedhet.methods.tct.entk import (
    coordinate_mask,
    iter_entk_chunks,
    reinit_head,
    trainable_parameter_count,
)
from fedhet.methods.tct.moments import FeatureMoments
from fedhet.methods.tct.sections import EntkSpec
from fedhet.plugin import (
    RunContext,
    RunError,
    Spec,
    StageNode,
    TrainSetup,
    build_model,
    build_setup,
    create_array,
    derive_seed,
    stage,
    stage_progress,
    tensors,
)

DTYPES = {"fp16": torch.float16, "fp32": torch.float32}


def convexified_model(spec: Spec, setup: TrainSetup, bootstrap: zarr.Group, seed: int) -> nn.Module:
    """theta_0 of the paper: the stage-1 model with its head re-drawn from `seed`."""
    ds = setup.dataset
    model = build_model(spec.model, ds.shape, ds.num_classes, spec.seed).to(setup.device)
    model.load_state_dict(tensors.load(bootstrap["model"], "final", setup.device))
    reinit_head(model, derive_seed(seed, "head"))
    return model


class FeatureWriter:
    """Streams feature blocks into a [rows, p] Zarr array (with `moments`, accumulating them)."""

    def __init__(
        self, group: zarr.Group, name: str, rows: int, config: EntkSpec, p: int, moments: bool
    ):
        self.dtype = DTYPES[config.dtype]
        self.array = create_array(
            group,
            name,
            shape=(rows, p),
            chunks=(min(config.chunk, max(rows, 1)), p),
            dtype=str(self.dtype).removeprefix("torch."),
        )
        self.moments = FeatureMoments.empty(p) if moments else None
        self.rows_written = 0

    def write(self, block: Tensor) -> None:
        stored = block.to(self.dtype)
        # the largest magnitude overflows the storage dtype iff some value does (rounding is
        # monotonic), and NaN propagates through amax: one cheap pass instead of an fp16 isfinite
        if not bool(torch.isfinite(block.abs().amax().to(self.dtype))):
            raise RunError(
                f"eNTK features of rows {self.rows_written}..{self.rows_written + len(block)} are "
                f"not finite in {self.dtype}; set algorithm.entk.dtype: fp32"
            )
        start = self.rows_written
        self.array[start : start + len(stored)] = stored.numpy()
        if self.moments is not None:
            self.moments.update(stored)
        self.rows_written += len(stored)


def _write_labels(group: zarr.Group, name: str, labels: list[Tensor]) -> None:
    values = torch.cat(labels).cpu().numpy().astype(np.int64)
    create_array(group, name, data=values)


def normalization_summary(moments: FeatureMoments, floor: float = 1e-6) -> dict[str, float | int]:
    std = moments.std(floor)
    return {
        "samples": moments.count,
        "mean_abs_max": float(moments.mean.abs().max()),
        "std_min": float(std.min()),
        "std_median": float(std.median()),
        "std_max": float(std.max()),
        "constant_coordinates": int((std <= floor).sum()),
    }


@stage("entk")
def run(node: StageNode, ctx: RunContext, out: zarr.Group, partial: Path) -> None:
    spec, config = ctx.spec, EntkSpec.model_validate(node.config)
    partition = node.upstream["bootstrap"].upstream["partition"]
    setup = build_setup(spec, ctx.store.open("partition", partition.key))
    model = convexified_model(spec, setup, ctx.upstream(node, "bootstrap"), config.seed)
    num_params = trainable_parameter_count(model)
    coords = coordinate_mask(num_params, config.subsample, derive_seed(config.seed, "mask"))
    p = int(coords.numel())
    ds = setup.dataset

    sizes = setup.sizes
    train = FeatureWriter(out, "train/features", sum(sizes), config, p, moments=True)
    test = FeatureWriter(out, "test/features", len(ds.test_y), config, p, moments=False)
    inputs = [(train, client.x) for client in setup.clients] + [(test, ds.test_x)]
    held_out = setup.validation
    if held_out is not None:
        held = FeatureWriter(out, "validation/features", held_out.n, config, p, moments=False)
        inputs.append((held, held_out.x))
        _write_labels(out, "validation/labels", [held_out.y])
    with stage_progress(ctx.console, spec.runtime.progress, "sample") as progress:
        total = sum(len(x) for _, x in inputs)
        task = progress.add_task(f"{spec.name}: tct eNTK", total=total, note="")
        for writer, x in inputs:
            for block in iter_entk_chunks(model, x, coords, config.chunk):
                writer.write(block)
                progress.advance(task, len(block))

    _write_labels(out, "train/labels", [c.y for c in setup.clients])
    create_array(
        out, "train/offsets", data=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    )
    _write_labels(out, "test/labels", [ds.test_y])
    create_array(out, "mask", data=coords.numpy().astype(np.int64))
    create_array(out, "mean", data=train.moments.mean.numpy())
    create_array(out, "std", data=train.moments.std().numpy())
    out.attrs.update(
        {
            "num_classes": ds.num_classes,
            "parameters": num_params,
            "p": p,
            "normalization": normalization_summary(train.moments),
        }
    )
