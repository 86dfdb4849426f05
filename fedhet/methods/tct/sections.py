"""The sub-blocks of TCT's spec block: stage 1's overrides, the eNTK features and stage 2."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from fedhet.plugin import MAX_SEED, OMIT_IF_DEFAULT, Count, LearningRate, Section


class Stage1Spec(Section):
    """Stage 1: FedAvg with the spec's federation settings, except what is set here."""

    rounds: Count | None = Field(None, description="T1; default: federation.rounds - stage2.rounds")
    lr: LearningRate | None = None
    local_epochs: float | None = Field(None, gt=0)
    local_steps: Count | None = None
    batch_size: Count | None = None


class EntkSpec(Section):
    """Convexify: eNTK features of the bootstrapped model with its head re-initialized."""

    subsample: int = Field(
        100_000, gt=0, le=10**8, description="p, the number of eNTK coordinates kept"
    )
    seed: int = Field(
        0, ge=0, le=MAX_SEED, description="seed of the head re-initialization and the mask"
    )
    dtype: Literal["fp16", "fp32"] = "fp16"
    chunk: Count = Field(256, description="samples per extraction batch and Zarr chunk")


class Stage2Spec(Section):
    """Stage 2: federated least squares on the normalized features (Appendix A)."""

    algorithm: Literal["scaffold", "fedavg", "gd"] = "scaffold"
    rounds: Count = Field(100, description="T2")
    local_steps: Count = Field(500, description="M, full-batch steps per round")
    lr: LearningRate = Field(5e-5, description="eta")
    solver: Annotated[Literal["closed_form", "explicit"], OMIT_IF_DEFAULT] = Field(
        "closed_form",
        description="closed_form: each round's M local steps exactly, from one factorization "
        "per client; explicit: step by step (the reference, M times slower)",
    )
