"""The client executors a run chooses from (`runtime.clients`): one client at a time
(`SequentialExecutor`), the round's cohort as one batched computation (`VectorizedExecutor`,
fedhet.engine.vectorized), or one client at a time with hand-derived MLP steps
(`FusedExecutor`, fedhet.engine.fused).

Vectorized and fused training take the sequential path's steps but round differently in
float32, so the executor that ran is recorded in the artifact's environment. All run the
trainer's one `client_step`; a round the chosen executor cannot run (BatchNorm, an objective
other than cross-entropy, a trainer that declares its clients not vectorizable, a synchronized
first step, momentum buffers kept across rounds; for fused also convolutions, momentum, or a
client step with hooks other than a proximal term's) runs sequentially, said once per run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import get_type_hints

import torch
from torch import nn

from fedhet.engine.client_step import LOCAL_SGD_HOOKS, ClientStep, Proximal
from fedhet.engine.cohort_gradients import linear_chain
from fedhet.engine.executor import ClientDiverged, ClientExecutor, SequentialExecutor
from fedhet.engine.fused import chain_layers, fused_sgd
from fedhet.engine.local import Divergence
from fedhet.engine.objectives import CrossEntropy
from fedhet.engine.trainer import ClientJob, ClientResult, Trainer
from fedhet.engine.vectorized import (
    CohortClient,
    CohortDivergence,
    cannot_vectorize,
    train_cohort,
)

SEQUENTIAL, VECTORIZED, FUSED = "sequential", "vectorized", "fused"


def auto_choice(trainer: Trainer, model: nn.Module, device: torch.device) -> str:
    """What `runtime.clients: auto` runs, the fastest executor measured for the run
    (benchmarks/cross_device.py, FedAvg MLP, 50 clients a round, batch 10, one CPU thread: fused
    rounds 2.5x faster than sequential, vectorized 1.1x; benchmarks/synthetic_rounds.py, FedAvg
    and FedProx logistic regression: fused 7-16x, vectorized 2-3x): fused on a CPU where its
    steps apply (an MLP, plain SGD, a method whose client step has no hooks or is a proximal
    term); else vectorized for a cohort of models without convolutions (grouped convolutions are
    no faster than one client at a time), on a GPU first; sequential otherwise."""
    if device.type == "cpu" and why_not_fused(trainer, model) is None:
        return FUSED
    convolutions = any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())
    cohort = trainer.setup.clients_per_round > 1
    return VECTORIZED if cohort and not convolutions and not trainer.keeps_buffers else SEQUENTIAL


def why_sequential(trainer: Trainer, model: nn.Module) -> str | None:
    """Why no round of `trainer` can run vectorized (None: every round without a synchronized
    first step can)."""
    if not trainer.vectorizable:
        hooks = ", ".join(trainer.own_training())
        return f"{trainer.config.name} trains its clients its own way" + (hooks and f" ({hooks})")
    reason = cannot_vectorize(model)
    if reason is not None:
        return reason
    if trainer.keeps_buffers:
        return "federation.momentum_buffers: client"
    if not isinstance(trainer.objective, CrossEntropy):
        return "its local objective is not cross-entropy"
    return None


def why_not_fused(trainer: Trainer, model: nn.Module) -> str | None:
    """Why no round of `trainer` can run fused (None: every round without a synchronized first
    step can)."""
    reason = why_sequential(trainer, model)
    if reason is not None:
        return reason
    if not fused_steps(declared_step(trainer)):
        return f"{trainer.config.name}'s client step changes local SGD"
    if trainer.momentum:
        return "the clients' SGD has momentum"
    if linear_chain(model, _one_input(trainer)) is None:
        return "the model is not a chain of Linear, ReLU and Flatten layers"
    return None


def declared_step(trainer: Trainer) -> type:
    """The class of the trainer's client steps: the base class if it keeps `client_step`, else
    the class its override declares it returns (object where it declares none, or just
    ClientStep, which every step is)."""
    client_step = type(trainer).client_step
    if client_step is Trainer.client_step:
        return ClientStep
    try:
        declared = get_type_hints(client_step).get("return", object)
    except NameError:  # an annotation only a type checker resolves
        return object
    return declared if isinstance(declared, type) and declared is not ClientStep else object


def fused_steps(step: type) -> bool:
    """Whether `fused_sgd` takes the steps of a client step of class `step`: the base class's
    (none of its own) or a proximal term's, no hook of local SGD changed."""
    if not issubclass(step, ClientStep):
        return False
    known = Proximal if issubclass(step, Proximal) else ClientStep
    return all(getattr(step, hook) is getattr(known, hook) for hook in LOCAL_SGD_HOOKS)


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread inside: a fused step's matmuls are too small to share (measured, FedAvg
    MLP cross-device end to end: 6.9 s on 1 thread, 8.5 s on 2 of 2 idle cores, 47 s on 2
    with one core busy), and the client states then do not depend on `runtime.threads`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _one_input(trainer: Trainer) -> torch.Tensor:
    return next(c.x[0] for c in trainer.setup.clients if c.n)


class _WithFallback:
    """An executor that trains a round its own way (`_round`) when it can, and otherwise runs
    the jobs sequentially, saying why once per run."""

    name: str
    reason: str | None  # why no round of the run can run this way (None: rounds can)

    def __init__(self, trainer: Trainer, say: Callable[[str], None]):
        self.trainer, self.say = trainer, say
        self.ran: set[str] = set()  # the executors rounds ran with

    def map(
        self, fn: Callable[[ClientJob], ClientResult], jobs: Sequence[ClientJob]
    ) -> list[ClientResult]:
        if not jobs:  # a round nobody reports in
            return []
        head = jobs[0]  # what the round's jobs share
        reason = self.reason or self.why_not_this_round(jobs)
        if not reason:
            step = self.trainer.client_step(head.round, head.global_state, head.server_state)
            reason = self.why_not_step(step)
        if reason:
            if SEQUENTIAL not in self.ran:
                self.say(f"clients: training sequentially, not {self.name} ({reason})")
            self.ran.add(SEQUENTIAL)
            return [fn(job) for job in jobs]
        self.ran.add(self.name)
        for job in jobs:  # as the sequential path, for `Trainer.client_finish`
            job.context = self.trainer.client_context(job)
        return self._round(jobs, step)

    def why_not_this_round(self, jobs: Sequence[ClientJob]) -> str | None:
        """Why this round's `jobs` run sequentially (None: they can run this way)."""
        synchronized = any(job.first_step is not None for job in jobs)
        return "a synchronized first step" if synchronized else None

    def why_not_step(self, step: ClientStep) -> str | None:
        """Why the round's client `step` runs sequentially (None: it can run this way)."""
        return None

    def _round(self, jobs: Sequence[ClientJob], step: ClientStep) -> list[ClientResult]:
        raise NotImplementedError


class FusedExecutor(_WithFallback):
    """The round's clients one at a time with `fused_sgd`."""

    name = FUSED

    def __init__(self, trainer: Trainer, device: torch.device, say: Callable[[str], None]):
        super().__init__(trainer, say)
        model = trainer.build_model().to(device)
        self.reason = why_not_fused(trainer, model)
        if self.reason is None:
            self.chain = chain_layers(model, linear_chain(model, _one_input(trainer)))

    def why_not_step(self, step: ClientStep) -> str | None:
        """A step of another class than its trainer declares, with hooks `fused_sgd` lacks."""
        if fused_steps(type(step)):
            return None
        return f"{self.trainer.config.name}'s client step changes local SGD"

    def _round(self, jobs: Sequence[ClientJob], step: ClientStep) -> list[ClientResult]:
        with one_thread(), torch.no_grad():  # no autograd bookkeeping on any operation
            return [self._train(job, step) for job in jobs]

    def _train(self, job: ClientJob, step: ClientStep) -> ClientResult:
        trainer = self.trainer
        try:
            state, stats = fused_sgd(
                self.chain,
                trainer.client_start(job),
                job.client.x,
                job.client.y,
                trainer.client_batches(job),
                job.sgd.lr,
                job.sgd.weight_decay,
                step if isinstance(step, Proximal) else None,
            )
        except Divergence as err:
            raise ClientDiverged(job.client.id, err) from err
        return trainer.finished(job, step, state, stats)


class VectorizedExecutor(_WithFallback):
    """The round's clients trained together by `train_cohort`, when the trainer can."""

    name = VECTORIZED

    def __init__(self, trainer: Trainer, device: torch.device, say: Callable[[str], None]):
        super().__init__(trainer, say)
        self.model = trainer.build_model().to(device)  # the architecture for functional_call
        self.reason = why_sequential(trainer, self.model)

    def why_not_this_round(self, jobs: Sequence[ClientJob]) -> str | None:
        if any(job.sgd != jobs[0].sgd for job in jobs):
            return "the clients' local optimizers differ"
        return super().why_not_this_round(jobs)

    def _round(self, jobs: Sequence[ClientJob], step: ClientStep) -> list[ClientResult]:
        trainer, head = self.trainer, jobs[0]
        clients = [
            CohortClient(
                job.client.x,
                job.client.y,
                list(trainer.client_batches(job)),
                step.extras(job.client_state),
                trainer.client_start(job),
            )
            for job in jobs
        ]
        try:
            trained = train_cohort(self.model, head.global_state, clients, head.sgd, step)
        except CohortDivergence as diverged:
            raise ClientDiverged(jobs[diverged.position].client.id, diverged.divergence) from None
        return [
            trainer.finished(job, step, result.state, result.stats)
            for job, result in zip(jobs, trained, strict=True)
        ]


def client_executor(
    setting: str, trainer: Trainer, device: torch.device, say: Callable[[str], None]
) -> ClientExecutor:
    """The executor `runtime.clients` asks for (auto: `auto_choice`)."""
    if setting == "auto":
        setting = auto_choice(trainer, trainer.build_model().to(device), device)
    if setting == VECTORIZED:
        return VectorizedExecutor(trainer, device, say)
    if setting == FUSED:
        return FusedExecutor(trainer, device, say)
    return SequentialExecutor()


def executor_name(executor: ClientExecutor) -> str:
    """What ran the clients, for the artifact's environment: sequential, vectorized, fused, or
    e.g. "sequential+vectorized" when some rounds fell back."""
    if isinstance(executor, _WithFallback):
        return "+".join(sorted(executor.ran)) or executor.name
    return SEQUENTIAL
