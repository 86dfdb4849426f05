"""Vectorized local training (fedhet.engine.vectorized) takes the sequential path's steps: one
round's client updates (states, mean losses, step counts, uploads, client states) agree with
`Trainer.client_update` on the same seeded generators, for FedAvg, FedProx, SCAFFOLD (both
corrections) and FedNova, with momentum and weight decay, clients of different step counts and
ragged batches: the one client step of each method, run for a cohort and for one client."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fedhet.core.spec import Spec, parse_spec
from fedhet.data.datasets import load_dataset
from fedhet.engine.client_executors import VectorizedExecutor
from fedhet.engine.client_step import ClientStep
from fedhet.engine.cohort_gradients import (
    StackedGradients,
    VmapGradients,
    cohort_gradients,
    linear_chain,
)
from fedhet.engine.executor import ClientDiverged
from fedhet.engine.loop import Engine
from fedhet.engine.trainer import ClientJob, ClientResult
from fedhet.engine.vectorized import (
    CohortClient,
    CohortDivergence,
    CohortResult,
    SGDSettings,
    cannot_vectorize,
    client_inputs,
    train_cohort,
)
from fedhet.models import build_model

torch.set_num_threads(1)
CPU = torch.device("cpu")
DIGITS = load_dataset("digits")
# float32 rounding: vmap's batched kernels and the padded, masked mean round differently from the
# sequential per-client kernels. Measured over these cases (30 steps, momentum 0.9): parameters
# differ by at most 3.1e-7 (abs; 1e-6 leaves a 3x margin), mean losses by 6e-8 relative.
RTOL, ATOL, LOSS_RTOL = 1e-5, 1e-6, 1e-6
MODELS = {
    "mlp": {"arch": "mlp", "hidden": [32, 16]},
    "cnn": {"arch": "simple_cnn", "norm": "none", "channels": [4, 8], "fc_width": 16},
    "cnn-group": {
        "arch": "simple_cnn",
        "norm": "group",
        "groups": 2,
        "channels": [4, 8],
        "fc_width": 16,
    },
}
ALGORITHMS = {
    "fedavg": {"name": "fedavg"},
    "fedprox": {"name": "fedprox", "mu": 0.1},
    "scaffold": {"name": "scaffold"},
    "scaffold-after-step": {"name": "scaffold", "correction": "after_step"},
    "fednova": {"name": "fednova"},
}


def make_model(model: dict) -> torch.nn.Module:
    return build_model(parse_spec({"model": model}).model, DIGITS.shape, DIGITS.num_classes, 0)


def make_spec(algorithm: dict, model: dict) -> Spec:
    return parse_spec(
        {
            "seed": 3,
            "partition": {"scheme": "dirichlet", "clients": 6, "alpha": 0.3},
            "model": model,
            # 1.5 epochs of batches of 16: ragged batches, a second permutation cut short
            "federation": {
                "rounds": 1,
                "batch_size": 16,
                "lr": 0.05,
                "local_epochs": 1.5,
                "momentum": 0.9,
                "weight_decay": 1e-3,
            },
            "algorithm": algorithm,
            "runtime": {"progress": False},
        }
    )


def round_jobs(engine: Engine) -> list[ClientJob]:
    """Round 0's jobs from a state with non-zero server and client controls (SCAFFOLD's c, c_i;
    the other algorithms keep no such state)."""
    state = engine.initial_state()
    gen = torch.Generator().manual_seed(0)
    state.server_state = {
        n: 0.01 * torch.randn(v.shape, generator=gen) for n, v in state.server_state.items()
    }
    if state.server_state:
        state.client_states = {
            cid: {
                n: 0.01 * torch.randn(v.shape, generator=gen) for n, v in state.server_state.items()
            }
            for cid in engine.holders[::2]
        }
    return engine.make_jobs(0, state, engine.holders)


def vectorized(engine: Engine, jobs: list[ClientJob], **options) -> list[CohortResult]:
    """`train_cohort` on the jobs with the trainer's client step."""
    algo, head = engine.algorithm, jobs[0]
    step = algo.client_step(head.round, head.global_state, head.server_state)
    inputs = [
        CohortClient(
            job.client.x,
            job.client.y,
            list(algo.client_batches(job)),
            step.extras(job.client_state),
        )
        for job in jobs
    ]
    return train_cohort(engine.model, head.global_state, inputs, head.sgd, step, **options)


def gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest |a - b| beyond the tolerance's relative part (<= ATOL when allclose)."""
    assert a.keys() == b.keys()
    return max(float(((a[k] - b[k]).abs() - RTOL * b[k].abs()).max()) for k in a)


def assert_agree(
    seq: list[ClientResult],
    vec: list[ClientResult],
    seq_jobs: list[ClientJob],
    vec_jobs: list[ClientJob],
):
    assert [r.client for r in vec] == [r.client for r in seq]
    assert [r.stats.steps for r in vec] == [r.stats.steps for r in seq]
    assert len({r.stats.steps for r in seq}) > 2  # clients of different step counts
    for s, v, s_job, v_job in zip(seq, vec, seq_jobs, vec_jobs, strict=True):
        assert gap(v.state, s.state) <= ATOL
        assert v.stats.mean_loss == pytest.approx(s.stats.mean_loss, rel=LOSS_RTOL)
        assert v.upload.keys() == s.upload.keys()
        assert v_job.client_state.keys() == s_job.client_state.keys()
        if s.upload:
            assert gap(v.upload, s.upload) <= ATOL
            assert gap(v_job.client_state, s_job.client_state) <= ATOL


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_one_round_agrees_with_the_sequential_path(tmp_path, algorithm, model):
    engine = Engine.from_spec(make_spec(ALGORITHMS[algorithm], MODELS[model]), tmp_path)
    seq_jobs, vec_jobs = round_jobs(engine), round_jobs(engine)
    sequential = [engine.train_client(job) for job in seq_jobs]  # updates their client states
    said: list[str] = []
    executor = VectorizedExecutor(engine.algorithm, CPU, said.append)
    assert_agree(sequential, executor.map(engine.train_client, vec_jobs), seq_jobs, vec_jobs)
    assert said == [] and executor.ran == {"vectorized"}


@pytest.mark.parametrize("algorithm", ["scaffold", "scaffold-after-step"])
def test_chunks_give_the_whole_cohort_bitwise(tmp_path, algorithm):
    engine = Engine.from_spec(make_spec(ALGORITHMS[algorithm], MODELS["mlp"]), tmp_path)
    reference = vectorized(engine, round_jobs(engine))
    chunked = vectorized(engine, round_jobs(engine), budget=1)  # one client per chunk
    for a, b in zip(chunked, reference, strict=True):
        assert a.stats == b.stats
        for k in b.state:
            assert torch.equal(a.state[k], b.state[k])


def test_divergence_names_the_first_diverged_client_and_its_step(tmp_path):
    engine = Engine.from_spec(make_spec(ALGORITHMS["fedavg"], MODELS["mlp"]), tmp_path)
    seq_jobs, cohort_jobs, vec_jobs = round_jobs(engine), round_jobs(engine), round_jobs(engine)
    for job in seq_jobs + cohort_jobs + vec_jobs:
        job.sgd = replace(job.sgd, lr=1e4)
    with pytest.raises(ClientDiverged) as sequential:
        for job in seq_jobs:
            engine.train_client(job)
    with pytest.raises(CohortDivergence) as cohort:
        vectorized(engine, cohort_jobs)
    assert str(sequential.value) == f"client {seq_jobs[cohort.value.position].client.id}: " + str(
        cohort.value.divergence
    )
    with pytest.raises(ClientDiverged) as executed:  # the executor reports it as the sequential
        VectorizedExecutor(engine.algorithm, CPU, print).map(engine.train_client, vec_jobs)
    assert str(executed.value) == str(sequential.value)


class Residual(torch.nn.Module):
    """Linear layers, but not a chain: the input is added back after them."""

    def __init__(self):
        super().__init__()
        self.flatten, self.fc = torch.nn.Flatten(), torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.flatten(x)
        return self.fc(h) + h


def test_linear_chains_train_stacked_any_other_model_vmapped():
    sample = DIGITS.train_x[0]
    mlp, cnn = make_model(MODELS["mlp"]), make_model(MODELS["cnn"])
    layers = linear_chain(mlp, sample)
    assert [type(m).__name__ for m in layers] == ["Flatten"] + ["Linear", "ReLU"] * 2 + ["Linear"]
    assert linear_chain(cnn, sample) is None and linear_chain(Residual(), sample) is None
    for model, kind in ((mlp, StackedGradients), (cnn, VmapGradients), (Residual(), VmapGradients)):
        assert type(cohort_gradients(model, model.state_dict(), sample, ClientStep())) is kind


def test_a_model_that_is_not_a_chain_trains_like_one_client_at_a_time():
    model = Residual()
    start = {n: v.clone() for n, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    x, y = DIGITS.train_x[:40], torch.randint(0, 64, (40,), generator=gen)
    clients = [client_inputs(x[:n], y[:n], 2, 8, gen) for n in (12, 20, 40)]
    settings = SGDSettings(0.1, momentum=0.9)
    for client, result in zip(clients, train_cohort(model, start, clients, settings), strict=True):
        model.load_state_dict(start)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for batch in client.batches:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(client.x[batch]), client.y[batch]).backward()
            optimizer.step()
        assert gap(result.state, model.state_dict()) <= ATOL


def test_batch_norm_stays_on_the_sequential_path():
    model = make_model({"arch": "mlp", "hidden": [8], "norm": "batch"})
    assert "BatchNorm" in cannot_vectorize(model)
    assert cannot_vectorize(make_model(MODELS["cnn-group"])) is None
    with pytest.raises(ValueError, match="cannot train vectorized"):
        train_cohort(model, model.state_dict(), [], SGDSettings(0.1))
