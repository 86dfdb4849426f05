"""The round loop: local SGD against a hand-written loop, sampling and weights, metrics and
bytes, determinism, resume from a checkpoint, and divergence handling."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedhet.core.errors import RunError
from fedhet.core.rng import torch_generator
from fedhet.core.spec import Spec, parse_spec
from fedhet.data.datasets import load_dataset
from fedhet.engine import tensors
from fedhet.engine.loop import Checkpoints, Engine, RunState, sample_clients
from fedhet.engine.trainer import Trainer
from fedhet.methods.centralized.algorithm import Centralized
from fedhet.methods.scaffold.algorithm import Scaffold
from fedhet.models import build_model, num_parameters

torch.set_num_threads(1)
CPU = torch.device("cpu")
DIGITS = load_dataset("digits")


def make_spec(checkpoint_every: int | None = 1000, **sections) -> Spec:
    """A run on digits with a small MLP; `sections` override parts of the spec."""
    raw = {
        "seed": 3,
        "partition": {"scheme": "dirichlet", "clients": 6, "alpha": 0.5},
        "model": {"arch": "mlp", "hidden": [16]},
        "federation": {"rounds": 3, "batch_size": 64, "lr": 0.05},
        # bitwise comparisons against the sequential executor
        "runtime": {
            "progress": False,
            "checkpoint_every": checkpoint_every,
            "clients": "sequential",
        },
        **sections,
    }
    return parse_spec(raw)


def comparable(metrics: dict[str, list[float]]) -> dict[str, list[float]]:
    """Every metric but wall time (the only one allowed to differ between identical runs)."""
    return {k: v for k, v in metrics.items() if k != "wall_time"}


def assert_states_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


# --- local SGD ----------------------------------------------------------------------------


def round_batches(spec: Spec, rnd: int, n: int, steps: int) -> list[torch.Tensor]:
    """Client 0's `steps` batches of round `rnd` over its `n` samples, written out by hand:
    seeded permutations cut into batches."""
    gen = torch_generator(spec.seed, "local", rnd, 0)
    size = spec.federation.batch_size
    batches: list[torch.Tensor] = []
    while len(batches) < steps:
        perm = torch.randperm(n, generator=gen)
        batches += [perm[i : i + size] for i in range(0, n, size)]
    return batches[:steps]


def reference_sgd(spec: Spec, x: torch.Tensor, y: torch.Tensor, steps: int) -> dict:
    """Plain SGD written out by hand over `round_batches`."""
    fed = spec.federation
    model = build_model(spec.model, DIGITS.shape, DIGITS.num_classes, spec.seed)
    params = list(model.parameters())
    for rnd in range(fed.rounds):
        lr = fed.lr * fed.lr_decay**rnd
        for idx in round_batches(spec, rnd, len(y), steps):
            loss = F.cross_entropy(model(x[idx]), y[idx])
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g in zip(params, grads, strict=True):
                    p -= lr * (g + fed.weight_decay * p)
    return dict(model.named_parameters())


@pytest.mark.parametrize("local", [{"local_steps": 9}, {"local_epochs": 2}])
def test_one_client_fedavg_is_plain_sgd(tmp_path, local):
    spec = make_spec(
        partition={"scheme": "iid", "clients": 1},
        federation={
            "rounds": 3,
            "batch_size": 256,
            "lr": 0.1,
            "lr_decay": 0.8,
            "weight_decay": 1e-3,
            **local,
        },
    )
    engine = Engine.from_spec(spec, tmp_path)
    setup, state = engine.setup, engine.run()
    client = setup.clients[0]
    # 1437 samples in batches of 256 give 6 batches per epoch; 9 steps cross an epoch boundary
    steps = local.get("local_steps") or 2 * math.ceil(client.n / 256)
    expected = reference_sgd(setup.spec, client.x, client.y, steps)
    for name, value in expected.items():
        torch.testing.assert_close(state.global_state[name], value.detach(), rtol=1e-5, atol=1e-6)
    initial = build_model(setup.spec.model, DIGITS.shape, DIGITS.num_classes, setup.spec.seed)
    assert not torch.allclose(initial.head.weight, state.global_state["head.weight"])


# --- sampling and aggregation weights -------------------------------------------------------


def test_sample_clients_is_seeded_sized_and_varies():
    rounds = [sample_clients(7, r, 10, 4) for r in range(200)]
    for r, picked in enumerate(rounds):
        assert len(picked) == 4 and len(set(picked)) == 4
        assert picked == sorted(picked) and all(0 <= c < 10 for c in picked)
        assert picked == sample_clients(7, r, 10, 4)
    assert len({tuple(p) for p in rounds}) > 50
    assert [sample_clients(8, r, 10, 4) for r in range(200)] != rounds
    counts = np.bincount(np.concatenate(rounds), minlength=10)
    assert np.all(np.abs(counts / 200 - 0.4) < 0.12)  # each client ~ 4/10 of the rounds
    assert sample_clients(7, 0, 5, 5) == list(range(5))


class RecordingFedAvg(Trainer):
    """FedAvg that records who was aggregated, with which weights, and the states involved."""

    def __init__(self, config, setup):
        super().__init__(config, setup)
        self.calls: list[dict] = []

    def aggregate(self, round, global_state, server_state, results, weights):
        new = super().aggregate(round, global_state, server_state, results, weights)
        self.calls.append(
            {
                "clients": [r.client for r in results],
                "weights": weights,
                "new": new,
                "states": [r.state for r in results],
            }
        )
        return new


@pytest.mark.parametrize("participation", [{"clients_per_round": 3}, {"fraction": 0.5}])
def test_rounds_sample_the_spec_clients_and_weight_them_by_size(tmp_path, participation):
    spec = make_spec(federation={"rounds": 4, "batch_size": 64, "lr": 0.05, **participation})
    engine = Engine.from_spec(spec, tmp_path, trainer=RecordingFedAvg)
    setup, state = engine.setup, engine.run()
    sizes = np.array(setup.sizes, dtype=float)
    for rnd, call in enumerate(engine.algorithm.calls):
        assert call["clients"] == sample_clients(setup.spec.seed, rnd, 6, 3)
        expected = sizes[call["clients"]] / sizes[call["clients"]].sum()
        np.testing.assert_allclose(call["weights"], expected, rtol=1e-12)
        # the stored weight divergence is (1/|S|) sum_i ||w_global - w_i||
        distances = [
            math.sqrt(sum(float(((call["new"][k] - s[k]).double() ** 2).sum()) for k in s))
            for s in call["states"]
        ]
        assert state.metrics["divergence"][rnd] == pytest.approx(np.mean(distances), rel=1e-9)
    assert len({tuple(c["clients"]) for c in engine.algorithm.calls}) > 1


def test_weighted_average_weights_each_client_state():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([5.0, -2.0]), "n": torch.tensor(4)}
    out = tensors.weighted_average([a, b], [0.25, 0.75])
    torch.testing.assert_close(out["w"], torch.tensor([4.0, -1.0]))
    assert out["n"].item() == 3  # integer buffers are not averaged


def counting_batches(base: type[Trainer]) -> type[Trainer]:
    """`base` that counts the samples its clients process per round."""

    class Counting(base):
        def __init__(self, config, setup):
            super().__init__(config, setup)
            self.samples: dict[int, int] = defaultdict(int)

        def client_batches(self, job):
            for idx in super().client_batches(job):
                self.samples[job.round] += len(idx)
                yield idx

    return Counting


@pytest.mark.parametrize("epochs", [1, 2])
def test_centralized_processes_as_many_samples_as_a_full_fedavg_round(tmp_path, epochs):
    counts = {}
    for name, base in [("fedavg", Trainer), ("centralized", Centralized)]:
        spec = make_spec(
            algorithm={"name": name},
            federation={"rounds": 2, "batch_size": 64, "lr": 0.05, "local_epochs": epochs},
        )
        engine = Engine.from_spec(spec, tmp_path / name, trainer=counting_batches(base))
        engine.run()
        counts[name] = dict(engine.algorithm.samples)
    total = len(DIGITS.train_y)
    assert counts["fedavg"] == counts["centralized"] == {0: epochs * total, 1: epochs * total}


# --- metrics ----------------------------------------------------------------------------


@pytest.mark.parametrize(("algorithm", "factor"), [("fedavg", 1), ("scaffold", 2)])
def test_bytes_are_the_parameters_times_4_per_sampled_client(tmp_path, algorithm, factor):
    spec = make_spec(
        algorithm={"name": algorithm},
        federation={"rounds": 2, "clients_per_round": 3, "batch_size": 64, "lr": 0.05},
    )
    state = Engine.from_spec(spec, tmp_path).run()
    model = build_model(spec.model, DIGITS.shape, DIGITS.num_classes, 0)
    expected = factor * num_parameters(model) * 4 * 3  # SCAFFOLD also sends control variates
    assert state.metrics["bytes_down"] == [expected, expected]
    assert state.metrics["bytes_up"] == [expected, expected]


def test_centralized_sends_nothing(tmp_path):
    spec = make_spec(algorithm={"name": "centralized"}, federation={"rounds": 1})
    state = Engine.from_spec(spec, tmp_path).run()
    assert state.metrics["bytes_down"] == state.metrics["bytes_up"] == [0.0]
    assert state.metrics["comm_rounds"] == [0.0]


def test_evaluation_runs_every_n_rounds_and_at_the_last(tmp_path):
    spec = make_spec(federation={"rounds": 5}, eval={"every": 2})
    metrics = Engine.from_spec(spec, tmp_path).run().metrics
    evaluated = [not math.isnan(a) for a in metrics["test_accuracy"]]
    assert evaluated == [False, True, False, True, True]
    assert all(0 < a <= 1 for a, e in zip(metrics["test_accuracy"], evaluated, strict=True) if e)
    assert all(t > 0 for t in metrics["wall_time"])


# --- determinism and resume ---------------------------------------------------------------

RESUMABLE = {
    "algorithm": {"name": "scaffold"},
    "federation": {
        "rounds": 5,
        "clients_per_round": 3,
        "batch_size": 64,
        "lr": 0.05,
        "momentum": 0.5,
    },
}


def test_the_same_spec_gives_bit_identical_runs(tmp_path):
    first = Engine.from_spec(make_spec(**RESUMABLE), tmp_path / "a").run()
    second = Engine.from_spec(make_spec(**RESUMABLE), tmp_path / "b").run()
    assert comparable(first.metrics) == comparable(second.metrics)
    assert_states_equal(first.global_state, second.global_state)
    other = Engine.from_spec(make_spec(**{**RESUMABLE, "seed": 4}), tmp_path / "c").run()
    assert comparable(other.metrics) != comparable(first.metrics)


class LastToFirst:
    """A client executor that trains the round's clients in reverse order (results in order)."""

    def __init__(self):
        self.rounds: list[list[int]] = []

    def map(self, fn, jobs):
        self.rounds.append([job.client.id for job in jobs])
        return [fn(job) for job in reversed(jobs)][::-1]


def test_results_do_not_depend_on_the_order_the_executor_trains_clients_in(tmp_path):
    sequential = Engine.from_spec(make_spec(**RESUMABLE), tmp_path / "a").run()
    engine = Engine.from_spec(make_spec(**RESUMABLE), tmp_path / "b")
    engine.executor = executor = LastToFirst()
    reordered = engine.run()
    assert len(executor.rounds) == RESUMABLE["federation"]["rounds"]
    assert all(len(clients) == 3 for clients in executor.rounds)  # every round went through it
    assert comparable(reordered.metrics) == comparable(sequential.metrics)
    assert_states_equal(reordered.global_state, sequential.global_state)
    assert_states_equal(reordered.server_state, sequential.server_state)
    for cid, controls in sequential.client_states.items():
        assert_states_equal(reordered.client_states[cid], controls)


class Interrupt(Exception):
    pass


def interrupted_and_resumed(
    fields: dict, tmp_path: Path
) -> tuple[RunState, RunState | None, RunState]:
    """(the uninterrupted run, the checkpoint left by the run stopped in round 3, that run
    resumed from it) of the spec `make_spec(**fields)`, checkpointing every 2 rounds."""
    reference = Engine.from_spec(make_spec(**fields), tmp_path / "reference").run()

    def stop_in_round_3(rnd, row):
        if rnd == 2:
            raise Interrupt

    folder = tmp_path / "interrupted"
    with pytest.raises(Interrupt):
        Engine.from_spec(make_spec(2, **fields), folder, on_round=stop_in_round_3).run()
    saved = Checkpoints(folder, CPU).latest()
    return reference, saved, Engine.from_spec(make_spec(2, **fields), folder).run()


def test_a_run_resumed_from_its_checkpoint_equals_an_uninterrupted_run(tmp_path):
    reference, saved, resumed = interrupted_and_resumed(RESUMABLE, tmp_path)
    assert saved.round == 2 and saved.client_states  # resumes from round 2, with controls
    assert resumed.metrics["wall_time"][:2] == saved.metrics["wall_time"]  # really resumed
    assert comparable(resumed.metrics) == comparable(reference.metrics)
    assert_states_equal(resumed.global_state, reference.global_state)
    assert_states_equal(resumed.server_state, reference.server_state)
    assert_states_equal(resumed.best_state, reference.best_state)


def test_a_run_returns_or_raises_once_what_its_checkpoints_replaced_is_deleted(tmp_path):
    """A save deletes the checkpoint it replaces on a thread (fedhet.engine.run_format); the run
    waits for it, so when `run` returns or raises its folder holds one checkpoint, the newest,
    and nothing being deleted."""
    from fedhet.engine.run_format import TRASH

    def entries(folder: Path) -> list[str]:
        return sorted(p.name for p in folder.iterdir())

    def stop_in_round_3(rnd, row):
        if rnd == 2:
            raise Interrupt

    spec, folder = make_spec(1, federation={"rounds": 5, "batch_size": 64, "lr": 0.05}), tmp_path
    with pytest.raises(Interrupt):
        Engine.from_spec(spec, folder, on_round=stop_in_round_3).run()
    stopped = entries(folder)
    assert [e for e in stopped if e.startswith("ckpt-")] == ["ckpt-000002.zarr"]
    assert not [e for e in stopped if e.startswith(TRASH)]
    Engine.from_spec(spec, folder).run()  # resumed: saves after rounds 3 and 4
    finished = entries(folder)
    assert [e for e in finished if e.startswith("ckpt-")] == ["ckpt-000004.zarr"]
    assert not [e for e in finished if e.startswith(TRASH)]


# --- divergence -------------------------------------------------------------------------


class PoisonedScaffold(Scaffold):
    """SCAFFOLD whose last client's loss turns NaN in round 3 (after the others trained)."""

    vectorizable = False

    def local_loss(self, job, model, x, y):
        loss = super().local_loss(job, model, x, y)
        if job.round == 2 and job.client.id == len(self.setup.clients) - 1:
            return loss * float("nan")
        return loss


@pytest.mark.parametrize("checkpoint_every", [1, 1000])
def test_divergence_names_round_and_client_and_keeps_the_state_before_the_round(
    tmp_path, checkpoint_every
):
    sections = {
        "partition": {"scheme": "iid", "clients": 4},
        "algorithm": {"name": "scaffold"},
        "federation": {"rounds": 4, "batch_size": 64, "lr": 0.05},
    }
    before = Engine.from_spec(
        make_spec(**{**sections, "federation": {**sections["federation"], "rounds": 2}}),
        tmp_path / "two-rounds",
    ).run()
    folder = tmp_path / "diverging"
    spec = make_spec(checkpoint_every, **sections)
    engine = Engine.from_spec(spec, folder, trainer=PoisonedScaffold)
    with pytest.raises(RunError) as failure:
        engine.run()
    message = str(failure.value)
    assert "\n" not in message
    assert message.startswith("round 3: client 3: loss became nan")
    assert str(folder) in message
    kept: RunState = Checkpoints(folder, CPU).latest()
    assert kept.round == 2
    assert comparable(kept.metrics) == comparable(before.metrics)
    # clients 0-2 had updated their control variates in round 3: none of it was kept
    assert kept.client_states.keys() == before.client_states.keys()
    for cid, controls in before.client_states.items():
        assert_states_equal(kept.client_states[cid], controls)
    assert_states_equal(kept.server_state, before.server_state)
    assert_states_equal(kept.global_state, before.global_state)


def test_unset_checkpoint_every_checkpoints_every_5_rounds_at_most_once_per_30_s(
    tmp_path, monkeypatch
):
    engine = Engine.from_spec(make_spec(None), tmp_path / "unset")
    clock = [0.0]
    monkeypatch.setattr("fedhet.engine.loop.time.monotonic", lambda: clock[0])
    engine.last_checkpoint = 0.0
    clock[0] = 29.0
    assert not engine.checkpoint_due(5)  # the last checkpoint (or the start) is recent
    clock[0] = 31.0
    assert engine.checkpoint_due(5) and engine.checkpoint_due(10)
    assert not engine.checkpoint_due(6)
    explicit = Engine.from_spec(make_spec(2), tmp_path / "explicit")
    explicit.last_checkpoint = clock[0]
    assert explicit.checkpoint_due(2) and not explicit.checkpoint_due(3)  # set: no clock


def test_a_fast_run_with_checkpoint_every_unset_writes_no_checkpoint(tmp_path):
    fields = {"federation": {"rounds": 6, "batch_size": 64, "lr": 0.05}}
    Engine.from_spec(make_spec(None, **fields), tmp_path).run()
    assert Checkpoints(tmp_path, CPU).latest() is None
