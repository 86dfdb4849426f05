"""The client executors a run chooses from (`runtime.clients`): one client at a time
(`SequentialExecutor`), or the round's cohort as one batched computation (`VectorizedExecutor`,
fedhet.engine.vectorized).

Vectorized training takes the sequential path's steps but rounds differently in float32, so
the executor that ran is recorded in the artifact's environment. Both run the trainer's one
`client_step`; a round the vectorized executor cannot run (BatchNorm, an objective other than
cross-entropy, a trainer that declares its clients not vectorizable, a synchronized first step,
momentum buffers kept across rounds) runs sequentially, said once per run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from fedhet.engine.executor import ClientDiverged, ClientExecutor, SequentialExecutor
from fedhet.engine.objectives import CrossEntropy
from fedhet.engine.trainer import ClientJob, ClientResult, Trainer
from fedhet.engine.vectorized import (
    CohortClient,
    CohortDivergence,
    SGDSettings,
    cannot_vectorize,
    train_cohort,
)

SEQUENTIAL, VECTORIZED = "sequential", "vectorized"


def auto_choice(model: nn.Module, clients_per_round: int) -> str:
    """What `runtime.clients: auto` runs: vectorized for a cohort of models without
    convolutions (measured on CPU: an MLP's rounds 2.0x faster), sequential otherwise (grouped
    convolutions are no faster than one client at a time)."""
    convolutions = any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())
    return VECTORIZED if clients_per_round > 1 and not convolutions else SEQUENTIAL


def why_sequential(trainer: Trainer, model: nn.Module) -> str | None:
    """Why no round of `trainer` can run vectorized (None: every round without a synchronized
    first step can)."""
    if not trainer.vectorizable:
        return f"{trainer.config.name} trains its clients its own way"
    reason = cannot_vectorize(model)
    if reason is not None:
        return reason
    if trainer.keeps_buffers:
        return "federation.momentum_buffers: client"
    if not isinstance(trainer.objective, CrossEntropy):
        return "its local objective is not cross-entropy"
    return None


class VectorizedExecutor:
    """The round's clients trained together by `train_cohort`, when the trainer can."""

    def __init__(self, trainer: Trainer, device: torch.device, say: Callable[[str], None]):
        self.trainer, self.say = trainer, say
        self.model = trainer.build_model().to(device)  # the architecture for functional_call
        self.reason = why_sequential(trainer, self.model)
        self.ran: set[str] = set()  # the executors rounds ran with

    def map(
        self, fn: Callable[[ClientJob], ClientResult], jobs: Sequence[ClientJob]
    ) -> list[ClientResult]:
        synchronized = any(job.first_step is not None for job in jobs)
        if self.reason or synchronized:
            self._fall_back(self.reason or "a synchronized first step")
            return [fn(job) for job in jobs]
        self.ran.add(VECTORIZED)
        trainer, head = self.trainer, jobs[0]  # what the round's jobs share
        step = trainer.client_step(head.round, head.global_state, head.server_state)
        clients = [
            CohortClient(
                job.client.x,
                job.client.y,
                list(trainer.client_batches(job)),
                step.extras(job.client_state),
            )
            for job in jobs
        ]
        settings = SGDSettings(head.lr, trainer.momentum, trainer.fed.weight_decay)
        try:
            trained = train_cohort(self.model, head.global_state, clients, settings, step)
        except CohortDivergence as diverged:
            raise ClientDiverged(jobs[diverged.position].client.id, diverged.divergence) from None
        return [
            trainer.finished(job, step, result.state, result.stats)
            for job, result in zip(jobs, trained, strict=True)
        ]

    def _fall_back(self, reason: str) -> None:
        if SEQUENTIAL not in self.ran:
            self.say(f"clients: training sequentially, not vectorized ({reason})")
        self.ran.add(SEQUENTIAL)


def client_executor(
    setting: str, trainer: Trainer, device: torch.device, say: Callable[[str], None]
) -> ClientExecutor:
    """The executor `runtime.clients` asks for (auto: `auto_choice` for the trainer's model,
    sequential where clients keep momentum buffers)."""
    if setting == "auto":
        auto = auto_choice(trainer.build_model(), trainer.setup.clients_per_round)
        setting = SEQUENTIAL if trainer.keeps_buffers else auto  # kept buffers: sequential
    if setting == VECTORIZED:
        return VectorizedExecutor(trainer, device, say)
    return SequentialExecutor()


def executor_name(executor: ClientExecutor) -> str:
    """What ran the clients, for the artifact's environment: sequential, vectorized, or
    "sequential+vectorized" when some rounds fell back."""
    if isinstance(executor, VectorizedExecutor):
        return "+".join(sorted(executor.ran)) or VECTORIZED
    return SEQUENTIAL
