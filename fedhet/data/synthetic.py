"""FedProx's Synthetic(alpha, beta) benchmark (Li et al., "Federated Optimization in Heterogeneous
Networks", MLSys 2020, Sec. 5.1), generated from the spec's seed.

    data: {dataset: synthetic, alpha: 1, beta: 1}      # or {dataset: synthetic, iid: true}
    partition: {scheme: natural}                       # its 30 clients

Client k (of `clients`, 30 in the paper) holds n_k = floor(LogNormal(4, 2)) + 50 samples (the
power law of the paper's code), x in R^60 and y = argmax softmax(W_k x + b_k) among 10 classes:

    u_k ~ N(0, alpha), B_k ~ N(0, beta)      W_k ~ N(u_k, 1) (60 x 10), b_k ~ N(u_k, 1) (10)
    v_k ~ N(B_k, 1) (60)                     x ~ N(v_k, Sigma), Sigma diagonal, Sigma_jj = j^-1.2

alpha controls how much the clients' models differ, beta how much their inputs do. As in the
paper's code, N(m, s) draws with standard deviation s. The IID variant shares one W, b ~ N(0, 1)
and v = 0 among all clients. A client's first 90% of draws (rounded down) train and the rest,
pooled over clients, are the test set: the paper's shuffled 90/10 split of each device, since
the draws are independent.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from fedhet.core.data_config import ArrayData, DataConfig, DataInfo
from fedhet.core.rng import numpy_rng
from fedhet.core.sections import MAX_CLIENTS, MAX_FACTOR

DIMENSION, CLASSES = 60, 10
TRAIN_SHARE = 0.9


class SyntheticData(DataConfig):
    loader: ClassVar[str] = "fedhet.data.synthetic:generate"

    dataset: Literal["synthetic"] = "synthetic"
    alpha: float = Field(0.0, ge=0, le=MAX_FACTOR, description="how much clients' models differ")
    beta: float = Field(0.0, ge=0, le=MAX_FACTOR, description="how much clients' inputs differ")
    iid: bool = Field(False, description="the IID variant: one model and input law for all")
    clients: int = Field(30, ge=1, le=MAX_CLIENTS, description="clients (devices)")

    @model_validator(mode="after")
    def _iid_has_no_alpha_or_beta(self) -> SyntheticData:
        if self.iid and (self.alpha or self.beta):
            raise ValueError("the IID variant has no alpha or beta; remove them or iid")
        return self

    def describe(self) -> DataInfo:
        return DataInfo((1, 1, DIMENSION), CLASSES, clients=self.clients)


def generate(config: SyntheticData, seed: int) -> ArrayData:
    """The benchmark's clients' data (see the module docstring), from `seed` alone."""
    rng = numpy_rng(seed, "synthetic")
    k = config.clients
    sizes = rng.lognormal(4, 2, k).astype(np.int64) + 50
    u, b_mean = rng.normal(0, config.alpha, k), rng.normal(0, config.beta, k)
    std = np.arange(1, DIMENSION + 1) ** -0.6  # sqrt of Sigma_jj = j^-1.2
    if config.iid:
        shared = rng.normal(0, 1, (DIMENSION, CLASSES)), rng.normal(0, 1, CLASSES)
        v = np.zeros((k, DIMENSION))
    else:
        v = rng.normal(b_mean[:, None], 1, (k, DIMENSION))
    train, test = [], []
    for client in range(k):
        if config.iid:
            w, b = shared
        else:
            w, b = rng.normal(u[client], 1, (DIMENSION, CLASSES)), rng.normal(u[client], 1, CLASSES)
        x = v[client] + rng.standard_normal((sizes[client], DIMENSION)) * std
        y = np.argmax(x @ w + b, axis=1)  # softmax is monotone: its argmax is the logits'
        cut = int(TRAIN_SHARE * sizes[client])
        train.append((x[:cut], y[:cut], np.full(cut, client)))
        test.append((x[cut:], y[cut:]))
    train_x, train_y, client_ids = (np.concatenate(parts) for parts in zip(*train, strict=True))
    test_x, test_y = (np.concatenate(parts) for parts in zip(*test, strict=True))
    return ArrayData(train_x, train_y, test_x, test_y, client_ids)
