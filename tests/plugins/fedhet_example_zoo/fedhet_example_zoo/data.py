"""The `blobs` data, drawn from the spec's seed alone."""

import numpy as np

from fedhet.core.data_config import ArrayData
from fedhet_example_zoo.plugin import BlobsData


def load(config: BlobsData, seed: int) -> ArrayData:
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 3, (config.classes, config.dimension))
    shifts = rng.normal(0, config.shift, (config.clients, config.dimension))
    n, test = config.clients * config.per_client, config.per_client // 5
    client = np.repeat(np.arange(config.clients), config.per_client)
    y = rng.integers(0, config.classes, n)
    x = centers[y] + shifts[client] + rng.normal(0, 1, (n, config.dimension))
    held = np.arange(n) % config.per_client < test
    return ArrayData(x[~held], y[~held], x[held], y[held], client[~held])
