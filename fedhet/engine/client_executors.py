"""The client executors a run chooses from (`runtime.clients`): one client at a time
(`SequentialExecutor`), or the round's cohort as one batched computation (`VectorizedExecutor`,
fedhet.engine.vectorized).

Vectorized training takes the sequential path's steps but rounds differently in float32, so
the executor that ran is recorded in the artifact's environment. It runs what a trainer's
`vectorized_term` describes; a round it cannot run (BatchNorm, an objective other than
cross-entropy, a client hook the term does not stand for, a synchronized first step, momentum
buffers kept across rounds) runs sequentially, said once per run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from fedhet.engine.executor import ClientExecutor, SequentialExecutor
from fedhet.engine.loop import ClientDiverged
from fedhet.engine.objectives import CrossEntropy
from fedhet.engine.trainer import CLIENT_HOOKS, ClientJob, ClientResult, Trainer
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
    """Why no round of `trainer` can run vectorized (None: its `vectorized_term` decides)."""
    reason = cannot_vectorize(model)
    if reason is not None:
        return reason
    if trainer.keeps_buffers:
        return "federation.momentum_buffers: client"
    if not isinstance(trainer.objective, CrossEntropy):
        return "its local objective is not cross-entropy"
    mro = type(trainer).__mro__
    owner = next(c for c in mro if "vectorized_term" in c.__dict__)
    for hook in CLIENT_HOOKS:
        definer = next(c for c in mro if hook in c.__dict__)
        if not issubclass(owner, definer):
            return f"{definer.__name__} overrides {hook}"
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
        term = None if self.reason else self.trainer.vectorized_term(list(jobs))
        if term is None or any(job.first_step is not None for job in jobs):
            reason = self.reason or (
                "a synchronized first step"
                if term is not None
                else f"{self.trainer.config.name} has no vectorized form with these settings"
            )
            self._fall_back(reason)
            return [fn(job) for job in jobs]
        self.ran.add(VECTORIZED)
        fed = self.trainer.fed
        clients = [
            CohortClient(
                job.client.x,
                job.client.y,
                list(self.trainer.client_batches(job)),
                term.extras(job.client_state),
            )
            for job in jobs
        ]
        settings = SGDSettings(jobs[0].lr, self.trainer.momentum, fed.weight_decay)
        try:
            trained = train_cohort(self.model, jobs[0].global_state, clients, settings, term)
        except CohortDivergence as diverged:
            raise ClientDiverged(jobs[diverged.position].client.id, diverged.divergence) from None
        results = []
        for job, result in zip(jobs, trained, strict=True):
            if result.client_state is not None:
                job.client_state.clear()
                job.client_state.update(result.client_state)
            results.append(
                ClientResult(job.client.id, result.state, job.client.n, result.stats, result.upload)
            )
        return results

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
