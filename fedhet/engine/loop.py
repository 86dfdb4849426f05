"""The round loop: sampling, local training, aggregation, evaluation, metrics, checkpoints."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import zarr
from torch import nn

from fedhet.core.errors import DivergedError
from fedhet.core.rng import numpy_rng, torch_generator
from fedhet.core.spec import Spec
from fedhet.data.clients import ClientData
from fedhet.data.partition import Partition
from fedhet.engine import tensors
from fedhet.engine.client_executors import client_executor
from fedhet.engine.executor import ClientDiverged, ClientExecutor, SequentialExecutor
from fedhet.engine.extension import continuation
from fedhet.engine.local import Divergence
from fedhet.engine.own_evaluation import NOT_SCORED, Score, own_scores, weighted_score
from fedhet.engine.run_format import Checkpoints, RunState
from fedhet.engine.schedule import round_lr
from fedhet.engine.setup import TrainSetup, build_setup
from fedhet.engine.system import RoundPlan, local_steps, plan_round
from fedhet.engine.tensors import Tensors
from fedhet.engine.trainer import ClientJob, ClientResult, Traffic, Trainer
from fedhet.process.interrupts import Interrupted

CHECKPOINT_ROUNDS = 5  # rounds between checkpoints when `runtime.checkpoint_every` is unset,
CHECKPOINT_MIN_SECONDS = 30.0  # and the least time between two of them then


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 1000,
    num_classes: int | None = None,
) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of `model` on (x, y) over its first `num_classes` outputs
    (default: all; a model with extra outputs, such as VHL's virtual classes, is scored on the
    outputs its `MethodConfig.scored_outputs` names)."""
    model.eval()
    correct, loss = 0, 0.0
    for start in range(0, len(y), batch_size):
        logits = model(x[start : start + batch_size])[:, :num_classes]
        target = y[start : start + batch_size]
        loss += float(F.cross_entropy(logits, target, reduction="sum"))
        correct += int((logits.argmax(1) == target).sum())
    return correct / len(y), loss / len(y)


def sample_clients(seed: int, round: int, num_clients: int, per_round: int) -> list[int]:
    if per_round >= num_clients:
        return list(range(num_clients))
    rng = numpy_rng(seed, "sample", round)
    return sorted(rng.choice(num_clients, size=per_round, replace=False).tolist())


def sample_holders(seed: int, round: int, holders: list[int], per_round: int) -> list[int]:
    """`per_round` of the clients in `holders` (those holding samples, `TrainSetup.holders`):
    positions in that list drawn by `sample_clients`. Empty clients are left out before the
    draw, so no round is short of clients; with every client a holder this is exactly
    `sample_clients(seed, round, len(holders), per_round)`."""
    return [holders[i] for i in sample_clients(seed, round, len(holders), per_round)]


def mean_over_clients(values: list[float]) -> float:
    """The mean of a round's client values; NaN in a round nobody reported."""
    return float(np.mean(values)) if values else float("nan")


RoundCallback = Callable[[int, dict[str, float]], None]
Say = Callable[[str], None]


def _silent(line: str) -> None:
    pass


class Engine:
    def __init__(
        self,
        algorithm: Trainer,
        setup: TrainSetup,
        checkpoints: Checkpoints,
        checkpoint_every: int | None,
        on_round: RoundCallback | None = None,
        executor: ClientExecutor | None = None,
    ):
        self.algorithm, self.setup = algorithm, setup
        self.executor = executor or SequentialExecutor()
        self.spec = setup.spec
        self.checkpoints, self.checkpoint_every = checkpoints, checkpoint_every
        self.on_round = on_round or (lambda r, m: None)
        self.model = algorithm.build_model().to(setup.device)
        self.weights_all = np.asarray(setup.sizes, dtype=np.float64) / sum(setup.sizes)
        self.holders = setup.holders  # only clients holding samples are ever sampled
        self.continuation: RunState | None = None  # set by `run`: what a longer run goes on from
        self.last_checkpoint = time.monotonic()

    @classmethod
    def from_spec(
        cls,
        spec: Spec,
        folder: Path,
        partition: zarr.Group | Partition | None = None,
        *,
        extras: dict[str, object] | None = None,
        trainer: type[Trainer] | None = None,
        on_round: RoundCallback | None = None,
        say: Say = _silent,
        announce: Say = _silent,
    ) -> Engine:
        """The engine of a run of `spec`, checkpointing into `folder` every
        `runtime.checkpoint_every` rounds: the clients of `partition` (`build_setup`; by default
        the spec's, computed in memory), the artifacts of the run's other upstream stages
        (`extras`, by role; `client_test`: the clients' own test sets), the algorithm's trainer
        (or `trainer`, a subclass of it), and the client executor `runtime.clients` asks for.
        `say` gets the executor's one line, `announce` the checkpoints' lines."""
        extras = extras or {}
        setup = build_setup(spec, partition, extras.get("client_test"))  # type: ignore[arg-type]
        setup.extras.update(extras)
        algorithm = (trainer or spec.algorithm.trainer_class())(spec.algorithm, setup)
        executor = client_executor(spec.runtime.clients, algorithm, setup.device, say)
        checkpoints = Checkpoints(folder, setup.device, announce)
        return cls(algorithm, setup, checkpoints, spec.runtime.checkpoint_every, on_round, executor)

    def initial_state(self, start: RunState | None = None) -> RunState:
        """The latest checkpoint or `start` (a stored shorter run's continuation), whichever is
        further along, else round 0."""
        resumed = self.checkpoints.latest()
        if start is not None and (resumed is None or start.round > resumed.round):
            return start
        if resumed is not None:
            return resumed
        global_state = tensors.clone(self.model.state_dict())
        return RunState(0, global_state, self.algorithm.init_server_state(global_state), {})

    def run(self, state: RunState | None = None) -> RunState:
        """Train from `state` (default: the latest checkpoint, or the start) to the last round;
        `self.continuation` is then the state a longer run has after this run's rounds."""
        state = state or self.initial_state()
        rounds = self.spec.federation.rounds
        before = state.snapshot()
        try:
            for rnd in range(state.round, rounds):
                before = state.snapshot()  # a round changes `state` in place, step by step
                self.run_round(rnd, state)
                state.round = rnd + 1
                if state.round < rounds and self.checkpoint_due(state.round):
                    before = state  # complete: an interrupt held until the save ends keeps it
                    self.checkpoints.save(state)
                    self.last_checkpoint = time.monotonic()
        except Interrupted as stop:  # the round in progress is dropped; the ones before are kept
            self.checkpoints.keep(before)
            stop.where = f"at round {before.round + 1} of {rounds}"
            raise
        finally:  # what the saves replaced is deleted by the time the run returns or raises
            self.checkpoints.wait_for_removals()
        self.continuation = continuation(state, before, self.spec.eval.every)
        return state

    def checkpoint_due(self, done: int) -> bool:
        """Whether the run checkpoints after `done` rounds: every `runtime.checkpoint_every`
        rounds; unset, every 5 rounds unless the last checkpoint (or the start) is under 30 s
        old (on a fast run, the writes would cost more than the rounds they keep)."""
        if self.checkpoint_every is not None:
            return done % self.checkpoint_every == 0
        recent = time.monotonic() - self.last_checkpoint < CHECKPOINT_MIN_SECONDS
        return done % CHECKPOINT_ROUNDS == 0 and not recent

    def plan(self, rnd: int) -> RoundPlan:
        """Who is sampled in round `rnd`, how many steps each does and who drops out."""
        setup = self.setup
        return plan_round(
            self.spec.federation,
            self.spec.seed,
            rnd,
            setup.sizes,
            self.holders,
            setup.clients_per_round,
            sample_holders,
        )

    def make_jobs(
        self, rnd: int, state: RunState, clients: list[int], steps: dict[int, int] | None = None
    ) -> list[ClientJob]:
        """The clients' jobs, each for its `steps` (default: its full local work this round)."""
        fed, seed, lr = self.spec.federation, self.spec.seed, round_lr(self.spec.federation, rnd)
        client_sgd = self.algorithm.client_sgd
        if steps is None:
            steps = {c: local_steps(fed, seed, rnd, c, self.setup.clients[c].n) for c in clients}
        jobs = []
        for cid in clients:
            model = self.model  # one model object is reused: each job loads its start first
            # a copy: the round's changes are committed only when the whole round succeeds
            own = state.client_states.get(cid)
            if own is None:
                own = self.algorithm.initial_client_state(self.setup.clients[cid])
            client_state = tensors.clone(own)
            gen = torch_generator(seed, "local", rnd, cid)
            jobs.append(
                ClientJob(
                    rnd,
                    self.setup.clients[cid],
                    model,
                    state.global_state,
                    state.server_state,
                    client_state,
                    client_sgd(rnd, self.setup.clients[cid], lr),
                    gen,
                    steps[cid],
                )
            )
        return jobs

    def run_round(self, rnd: int, state: RunState) -> None:
        """One round: the plan's reporting clients train and are aggregated, weights renormalized
        over them; a round nobody reports keeps every state (its metrics say so)."""
        started = time.perf_counter()
        algo = self.algorithm
        plan = self.plan(rnd)
        reported = plan.reported
        weights = self.weights_all[reported] / self.weights_all[reported].sum()
        jobs = self.make_jobs(rnd, state, reported, plan.steps)
        self.model.load_state_dict(state.global_state)
        traffic = (
            algo.synchronized_first_step(rnd, self.model, jobs, weights.tolist())
            if jobs
            else Traffic()
        )
        down = tensors.nbytes(algo.shared(state.global_state)) + tensors.nbytes(
            algo.download(rnd, state.server_state)
        )
        try:
            results = self.executor.map(self.train_client, jobs)
        except ClientDiverged as diverged:
            self.fail(rnd, state, str(diverged))
        server_state = tensors.clone(state.server_state)  # aggregate may update it in place
        new_global = (
            algo.aggregate(rnd, state.global_state, server_state, results, weights.tolist())
            if results
            else state.global_state
        )
        if not tensors.all_finite(new_global):
            self.fail(rnd, state, "the aggregated model is not finite")
        state.server_state = server_state
        state.client_states.update({job.client.id: job.client_state for job in jobs})
        self.record(rnd, state, new_global, results, len(plan.sampled) * down, traffic, started)
        if self.spec.federation.system is not None:
            for name, value in plan.metrics().items():
                state.metrics.setdefault(name, []).append(value)
        for name, value in algo.round_metrics(rnd, results, weights.tolist()).items():
            values = state.metrics.setdefault(name, [])
            values.extend([float("nan")] * (rnd - len(values)))  # resumed from before the metric
            values.append(value)

    def train_client(self, job: ClientJob) -> ClientResult:
        """One client's local training from its start (`Trainer.client_start`): what the
        executor runs per job."""
        job.model.load_state_dict(self.algorithm.client_start(job))
        try:
            return self.algorithm.client_update(job)
        except Divergence as err:
            raise ClientDiverged(job.client.id, err) from err

    def fail(self, rnd: int, state: RunState, what: str) -> None:
        # `state` is still the state before this round: keep it (and the metrics so far)
        self.checkpoints.keep(state)
        message = (
            f"round {rnd + 1}: {what}; metrics so far kept in {self.checkpoints.folder} "
            "(lower federation.lr)"
        )
        raise DivergedError(message, rnd + 1, state.metrics)

    def record(
        self,
        rnd: int,
        state: RunState,
        new_global: Tensors,
        results: list[ClientResult],
        bytes_down: int,
        traffic: Traffic,
        started: float,
    ) -> None:
        algo = self.algorithm
        up = sum(tensors.nbytes(algo.shared(r.state)) + tensors.nbytes(r.upload) for r in results)
        shared_global = algo.shared(new_global)
        divergence = mean_over_clients(
            [tensors.distance(shared_global, algo.shared(r.state)) for r in results]
        )
        train_loss = mean_over_clients([r.stats.mean_loss for r in results])
        state.global_state = new_global
        validation = self.setup.validation
        (acc, loss), (val_acc, val_loss) = NOT_SCORED, NOT_SCORED
        last = rnd + 1 == self.spec.federation.rounds
        if (rnd + 1) % self.spec.eval.every == 0 or last:
            (acc, loss), (val_acc, val_loss) = self.evaluation_round(new_global, state)
            chosen_by = acc if validation is None else val_acc  # the best model's criterion
            if chosen_by > state.best_accuracy:
                state.best_accuracy, state.best_state = chosen_by, tensors.clone(new_global)
        row = {
            "test_accuracy": acc,
            "test_loss": loss,
            "train_loss": train_loss,
            "divergence": divergence,
            "bytes_up": float(up + traffic.bytes_up),
            "bytes_down": float(bytes_down + traffic.bytes_down),
            "comm_rounds": float((1 if shared_global else 0) + traffic.rounds),
            "wall_time": time.perf_counter() - started,
        }
        if validation is not None:
            row |= {"val_accuracy": val_acc, "val_loss": val_loss}
        for name, value in row.items():
            state.metrics.setdefault(name, []).append(value)
        self.on_round(rnd, row)

    def evaluation_round(self, global_state: Tensors, state: RunState) -> tuple[Score, Score]:
        """The (test, validation) scores of an evaluation round (validation NaN without a
        split): a personalized method's clients each on their own samples where it has them
        (fedhet.engine.own_evaluation), otherwise the mean of `Trainer.evaluation_states` on the
        pooled sets."""
        setup, algo = self.setup, self.algorithm
        own: dict[str, tuple[list[ClientData], list[float]]] = {}  # split -> (samples, weights)
        if self.spec.algorithm.personalized:
            if setup.held_out is not None:
                own["val"] = (setup.held_out, [float(c.n) for c in setup.held_out])
            if setup.client_tests is not None:
                own["test"] = (setup.client_tests, [float(n) for n in setup.sizes])
        scores: dict[str, Score] = {}
        if own:
            scored = self.spec.algorithm.scored_outputs(setup.dataset.num_classes)

            def score(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Score:
                return evaluate(model, x, y, self.spec.runtime.eval_batch_size, scored)

            per_client = own_scores(
                algo,
                self.model,
                global_state,
                state.client_states,
                [split for split, _ in own.values()],
                score,
            )
            for name, values, (_, weights) in zip(own, per_client, own.values(), strict=True):
                scores[name] = weighted_score(values, weights)
        val = setup.validation
        if "test" not in scores or ("val" not in scores and val is not None):
            evaluated = algo.evaluation_states(global_state, state.client_states)
            if "test" not in scores:
                scores["test"] = self.evaluate_states(evaluated)
            if "val" not in scores and val is not None:
                scores["val"] = self.evaluate_states(evaluated, val.x, val.y)
        return scores["test"], scores.get("val", NOT_SCORED)

    def evaluate_states(
        self, states: list[Tensors], x: torch.Tensor | None = None, y: torch.Tensor | None = None
    ) -> tuple[float, float]:
        """(accuracy, loss) on (x, y), by default the test set, averaged over model states (one:
        the global model)."""
        ds = self.setup.dataset
        scored = self.spec.algorithm.scored_outputs(ds.num_classes)
        if x is None or y is None:
            x = self.setup.extras.get("test_x", ds.test_x)
            y = self.setup.extras.get("test_y", ds.test_y)
        scores = []
        for model_state in states:
            self.model.load_state_dict(model_state)
            scores.append(evaluate(self.model, x, y, self.spec.runtime.eval_batch_size, scored))
        accuracies, losses = zip(*scores, strict=True)
        return float(np.mean(accuracies)), float(np.mean(losses))
