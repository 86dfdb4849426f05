"""FedDyn's spec block: `algorithm: {name: feddyn, alpha: ..., alpha_per_client: ...}`."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from fedhet.plugin import OMIT_IF_DEFAULT, MethodConfig


class FedDynConfig(MethodConfig):
    trainer: ClassVar[str | None] = "fedhet.methods.feddyn.algorithm:FedDyn"
    accepts_objectives: ClassVar[bool] = True
    # 1: the gradient of CE and the linear term clipped at `clip_norm`, alpha_k theta after the clip
    revision: ClassVar[int] = 1
    display_name: ClassVar[str | None] = "FedDyn"
    name: Literal["feddyn"] = "feddyn"
    alpha: float = Field(
        0.01,
        gt=0,
        allow_inf_nan=False,
        description="alpha of the dynamic regularizer (the official code's example: 0.01; the "
        "paper searches {0.1, 0.01, 0.001})",
    )
    alpha_per_client: Annotated[Literal["size", "uniform"], OMIT_IF_DEFAULT] = Field(
        "size",
        description="size: client k trains with alpha * (mean size) / n_k, as the official code; "
        "uniform: every client with alpha, as the paper's Algorithm 1 (equal sizes: the same)",
    )

    clip_norm: Annotated[float | None, OMIT_IF_DEFAULT] = Field(
        10.0,
        gt=0,
        allow_inf_nan=False,
        description="each local step's gradient of the data loss and the regularizer's linear "
        "term clipped to this norm before alpha * theta is added, as the official code (10); "
        "null: no clipping",
    )

    def settings(self) -> list[str]:
        uniform = ["uniform alpha"] if self.alpha_per_client == "uniform" else []
        clip = "no clipping" if self.clip_norm is None else f"clip norm={self.clip_norm:g}"
        return uniform + ([clip] if self.clip_norm != 10.0 else [])
