"""The spec blocks of the FedOpt family: `algorithm: {name: fedadam | fedyogi | fedadagrad |
fedavgm, server_lr: ..., ...}`. One trainer (`algorithm.FedOpt`) runs all four; the name picks the
server's optimizer. The defaults and where they come from are in `algorithm`'s docstring."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from fedhet.plugin import InputError, LearningRate, MethodConfig, Momentum


class _FedOptConfig(MethodConfig):
    """The clients train as in FedAvg; the server applies its own optimizer to the round's
    pseudo-gradient x - (weighted average of the clients' models)."""

    trainer: ClassVar[str | None] = "fedhet.methods.fedopt.algorithm:FedOpt"
    accepts_objectives: ClassVar[bool] = True  # the client side is FedAvg's
    adaptive: ClassVar[bool] = True  # keeps a second moment v (FedAvgM does not)

    server_lr: LearningRate = Field(
        0.1, description="eta: the server optimizer's learning rate (constant over rounds)"
    )


class _AdaptiveConfig(_FedOptConfig):
    beta1: Momentum = Field(0.9, description="beta_1: decay of the first moment m (0: no momentum)")
    tau: float = Field(
        1e-3, gt=0, description="tau: the adaptivity (added to sqrt(v) in the denominator)"
    )
    form: Literal["paper", "keras"] = Field(
        "paper",
        description="paper: Reddi et al. Alg. 2 (v starts at tau^2, no bias correction); keras: "
        "the authors' TFF experiments (v starts at 0; FedAdam's and FedYogi's step size "
        "eta sqrt(1 - beta_2^t) / (1 - beta_1^t), as Keras Adam)",
    )


class _SecondMomentDecay(_AdaptiveConfig):
    beta2: float = Field(
        0.99,
        ge=0,
        le=1,
        description="beta_2: decay of the second moment v (1: v stays at its start, no adaptivity)",
    )

    def check(self, spec) -> None:
        super().check(spec)
        if self.form == "keras" and self.beta2 == 1:
            raise InputError(
                f"algorithm.beta2: 1 with form: keras makes {self.name}'s bias-corrected step "
                "size eta sqrt(1 - beta_2^t) / (1 - beta_1^t) zero; use beta2 < 1 or form: paper"
            )


class FedAdamConfig(_SecondMomentDecay):
    display_name: ClassVar[str | None] = "FedAdam"
    name: Literal["fedadam"] = "fedadam"


class FedYogiConfig(_SecondMomentDecay):
    display_name: ClassVar[str | None] = "FedYogi"
    name: Literal["fedyogi"] = "fedyogi"


class FedAdagradConfig(_AdaptiveConfig):
    display_name: ClassVar[str | None] = "FedAdagrad"
    name: Literal["fedadagrad"] = "fedadagrad"
    beta1: Momentum = Field(
        0.0,
        description="beta_1: decay of the first moment m (0, the default: none, as Keras Adagrad "
        "in the authors' experiments; Alg. 2 allows one)",
    )


class FedAvgMConfig(_FedOptConfig):
    adaptive: ClassVar[bool] = False
    display_name: ClassVar[str | None] = "FedAvgM"
    name: Literal["fedavgm"] = "fedavgm"
    server_lr: LearningRate = Field(
        1.0,
        description="eta: the server's learning rate (1: Hsu et al.'s w <- w - v; constant)",
    )
    server_momentum: Momentum = Field(
        0.9, description="beta: the server's momentum, v <- beta v + pseudo-gradient"
    )
