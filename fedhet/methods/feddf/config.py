"""FedDF's spec block: `algorithm: {name: feddf, server_data: real | noise, ...}`.

The defaults are the official code's FedDF runs (epfml/federated-learning-public-code,
codes/FedDF-code: README's commands and pcode/aggregation/noise_knowledge_transfer.py): up to
10000 distillation steps a round of Adam at 1e-3 on batches of 128, the teachers' averaged
logits, temperature 1, the student checked on the validation split every 100 steps and stopped
1000 steps after its best.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from fedhet.plugin import (
    MAX_COUNT,
    OMIT_IF_DEFAULT,
    Count,
    Epochs,
    InputError,
    LearningRate,
    MethodConfig,
    Spec,
)


class FedDFConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.feddf.algorithm:FedDF"
    display_name: ClassVar[str | None] = "FedDF"
    name: Literal["feddf"] = "feddf"
    server_data: Literal["real", "noise"] = Field(
        "real",
        description="the server's unlabeled inputs: real = the training samples data.server "
        "holds out of every client's share; noise = a fresh batch of Gaussian noise each step, "
        "min-max scaled to the pixel range and normalized as the dataset's images",
    )
    steps: int = Field(
        10000,
        ge=0,
        le=MAX_COUNT,
        description="distillation steps after each round's average (official "
        "total_n_server_pseudo_batches); 0 is FedAvg",
    )
    batch_size: Count = Field(128, description="server inputs per step")
    lr: LearningRate = Field(1e-3, description="the student's Adam learning rate (cosine to 0)")
    temperature: float = Field(1.0, gt=0, description="softmax temperature of the KL loss")
    ensemble: Literal["logits", "probs"] = Field(
        "logits",
        description="the teacher: softmax of the clients' mean logits (the paper's Algorithm 1, "
        "the official runs' avg_logits), or the mean of their softmax outputs",
    )
    eval_every: Count = Field(100, description="steps between the student's validation checks")
    patience: Count | None = Field(
        1000,
        description="stop this many steps after the best validation accuracy and keep the best "
        "student (needs data.validation); null: every step, the last student",
    )

    local_epochs: Annotated[Epochs | None, OMIT_IF_DEFAULT] = Field(
        None,
        description="each sampled client's local epochs a round, replacing the federation's "
        "local work for FedDF alone (FedDF's official runs: 40); null: the federation's, as "
        "every other row of the comparison",
    )

    def check(self, spec: Spec) -> None:
        super().check(spec)
        if self.local_epochs is not None and spec.federation.system is not None:
            raise InputError(
                "algorithm.local_epochs: replaces the local work that federation.system draws "
                "or cuts; remove one of them"
            )
        if self.server_data == "real" and spec.data.server is None:
            raise InputError(
                "algorithm.server_data: real distills on training samples no client holds; set "
                "data.server (how many, e.g. 500) or use server_data: noise"
            )
        if self.patience is not None and self.steps > 0 and spec.data.validation is None:
            raise InputError(
                "algorithm.patience: FedDF's early stopping checks the student on the validation "
                "split; set data.validation (e.g. 0.1) or patience: null"
            )

    def settings(self) -> list[str]:
        noise = ["noise"] if self.server_data == "noise" else []
        epochs = [] if self.local_epochs is None else [f"local epochs={self.local_epochs:g}"]
        return noise + epochs
