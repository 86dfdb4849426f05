"""A stored partition's arrays: per-client index lists (concatenated indices and offsets),
the clients x classes histogram, rotation angles, held-out validation and server indices.
numpy and zarr only, so commands that read a stored partition import no torch."""

from __future__ import annotations

import numpy as np
import zarr

from fedhet.core.sealed import create_array
from fedhet.data.partition import Partition


def save_partition(out: zarr.Group, part: Partition) -> None:
    save_index_lists(out, part.client_indices)
    create_array(out, "histogram", data=part.histogram.astype(np.int64))
    if part.angles is not None:
        create_array(out, "angles", data=np.asarray(part.angles, dtype=np.float64))
    if part.validation_indices is not None:
        save_index_lists(out, part.validation_indices, "validation/")
    if part.server_indices is not None:
        create_array(out, "server/indices", data=part.server_indices.astype(np.int64))


def save_index_lists(out: zarr.Group, lists: list[np.ndarray], prefix: str = "") -> None:
    """Index arrays, one per client, as `<prefix>indices` (concatenated) and `<prefix>offsets`."""
    sizes = np.array([len(i) for i in lists], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    indices = np.concatenate(lists).astype(np.int64)
    chunk = max(1, min(len(indices), 1 << 16))
    create_array(out, f"{prefix}indices", data=indices, chunks=(chunk,))
    create_array(out, f"{prefix}offsets", data=offsets)


def load_index_lists(group: zarr.Group) -> list[np.ndarray]:
    indices, offsets = group["indices"][:], group["offsets"][:]
    return [indices[offsets[k] : offsets[k + 1]] for k in range(len(offsets) - 1)]


def load_partition(group: zarr.Group) -> Partition:
    angles = group["angles"][:] if "angles" in group else None
    validation = load_index_lists(group["validation"]) if "validation" in group else None
    server = group["server"]["indices"][:] if "server" in group else None
    return Partition(load_index_lists(group), group["histogram"][:], angles, validation, server)
