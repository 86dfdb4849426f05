"""The `runtime:` section: how a run executes (device, threads, checkpoints, progress); never
part of a key."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedhet.core.sections import MAX_THREADS, Count, Section


class ResourcesSpec(Section):
    """What one node asks of a Ray cluster (`fedhet train --ray`): gpus 0.25 lets 4 share a GPU."""

    cpus: float = Field(1.0, gt=0)
    gpus: float = Field(0.0, ge=0)


class RuntimeSpec(Section):
    """Execution settings; never part of a key."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = Field(None, ge=1, le=MAX_THREADS)
    clients: Literal["sequential", "vectorized", "fused", "auto"] = Field(
        "auto",
        description="how a round's clients train: sequential, one at a time through autograd; "
        "vectorized, the cohort as one batched computation; fused, one at a time with "
        "hand-derived MLP steps (vectorized and fused round differently in float32; a round "
        "they cannot run falls back to sequential, said once); auto, the fastest that applies "
        "(fused on CPU, else vectorized for models without convolutions, else sequential)",
    )
    checkpoint_every: Count | None = Field(
        None,
        description="rounds between checkpoints, what a crash can lose (Ctrl-C loses nothing); "
        "unset: every 5 rounds, skipped while the last checkpoint is under 30 s old",
    )
    eval_batch_size: Count = 1000
    progress: bool = True
    tensorboard: str | None = Field(
        None, description="folder for TensorBoard events, one subfolder per run, per round"
    )
    resources: ResourcesSpec = ResourcesSpec()
