"""The engine's client start and finish (`Trainer.own_names`, `client_start`, `client_finish`)
change no result: every method moved onto them trains, for 2 rounds on digits with the
sequential executor, to the bits it trained to when it overrode `client_update` (main fce7e75):
the same global state, client states and round metrics. tests/golden/client_start.json holds
those runs' SHA-256 digests for each CPU instruction set torch's kernels used (the bits depend on
it, and may on the CPU's vendor), written from fce7e75's code by this file run as a script with a
worktree of fce7e75 on PYTHONPATH (torch 2.14.1, one thread): AVX512 on the machine of the
earlier sessions, AVX2 on an AMD EPYC. The methods that now train vectorized (Local and the
local-layer methods) agree with the sequential executor to float tolerance."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhet.core.spec import parse_spec
from fedhet.engine.client_executors import FusedExecutor, VectorizedExecutor
from fedhet.engine.loop import Engine

torch.set_num_threads(1)
GOLDEN = Path(__file__).parent / "golden" / "client_start.json"
MLP = {"arch": "mlp", "hidden": [16]}
CASES = {
    "local": ({"name": "local"}, MLP, {}),
    "local-kept-buffers": (
        {"name": "local"},
        MLP,
        {"momentum": 0.9, "momentum_buffers": "client"},
    ),
    "fedper": ({"name": "fedper"}, MLP, {"momentum": 0.5, "weight_decay": 1e-3}),
    "lgfedavg": ({"name": "lgfedavg"}, MLP, {}),
    "fedrep": ({"name": "fedrep", "head_epochs": 0.5}, MLP, {}),
    "fedrod": ({"name": "fedrod"}, MLP, {}),
    "fedbn": ({"name": "fedbn"}, {**MLP, "norm": "batch"}, {}),
    "silobn": ({"name": "silobn"}, {**MLP, "norm": "batch"}, {}),
    "ditto": ({"name": "ditto", "lam": 0.1}, MLP, {}),
    "apfl": ({"name": "apfl"}, MLP, {}),
    "pfedme": ({"name": "pfedme"}, MLP, {}),
    "fedimpro": (
        {"name": "fedimpro", "weight": 0.5, "ramp": 0, "sample_from": "client", "noise_std": 0.1},
        {"arch": "simple_cnn"},
        {},
    ),
}
# their clients now train vectorized and (plain SGD: not FedPer's case) fused
OTHER_EXECUTORS = [
    *((case, VectorizedExecutor) for case in ("local", "fedper", "lgfedavg")),
    *((case, FusedExecutor) for case in ("local", "lgfedavg")),
]


def spec_of(case: str, clients: str = "sequential"):
    algorithm, model, federation = CASES[case]
    return parse_spec(
        {
            "seed": 4,
            "data": {"dataset": "digits"},
            "partition": {"scheme": "dirichlet", "clients": 6, "alpha": 0.5},
            "model": model,
            "federation": {
                "rounds": 2, "clients_per_round": 4, "batch_size": 16, "lr": 0.05,
                "local_steps": 3, **federation,
            },
            "algorithm": algorithm,
            "runtime": {"progress": False, "device": "cpu", "clients": clients},
        }
    )  # fmt: skip


def digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 of the tensors' names and bytes, in name order."""
    sha = hashlib.sha256()
    for name in sorted(tensors):
        sha.update(name.encode())
        sha.update(tensors[name].detach().cpu().contiguous().numpy().tobytes())
    return sha.hexdigest()


def fingerprint(case: str, folder: Path) -> dict[str, str]:
    """Digests of a 2-round run's global state, client states and metrics (not wall times)."""
    state = Engine.from_spec(spec_of(case), folder).run()
    clients = {f"{c}/{n}": v for c, own in state.client_states.items() for n, v in own.items()}
    metrics = {
        name: torch.from_numpy(np.asarray(values, dtype=np.float64))
        for name, values in state.metrics.items()
        if name != "wall_time"
    }
    return {
        "global": digest(state.global_state),
        "clients": digest(clients),
        "metrics": digest(metrics),
    }


CAPABILITY = torch.backends.cpu.get_cpu_capability()


@pytest.mark.parametrize("case", CASES)
def test_a_run_trains_to_the_bits_of_main(case, tmp_path):
    golden = json.loads(GOLDEN.read_text())
    if CAPABILITY not in golden:
        pytest.skip(f"{GOLDEN.name} has no digests for CPU capability {CAPABILITY}")
    assert fingerprint(case, tmp_path) == golden[CAPABILITY][case]


@pytest.mark.parametrize(("case", "executor"), OTHER_EXECUTORS, ids=lambda x: getattr(x, "name", x))
def test_own_layers_train_on_other_executors_as_sequentially(case, executor, tmp_path):
    """A round's results and kept entries on the vectorized or fused executor, each client from
    its own start, agree with the sequential executor's (tests/test_vectorized.py's tolerances:
    float32 rounds differently there)."""
    from tests.test_vectorized import ATOL, gap

    engine = Engine.from_spec(spec_of(case), tmp_path)
    state = engine.initial_state()
    engine.run_round(0, state)  # the round's clients now hold entries of their own
    clients = engine.holders
    sequential_jobs, other_jobs = (engine.make_jobs(1, state, clients) for _ in range(2))
    starts = {digest(engine.algorithm.client_start(job)) for job in other_jobs}
    assert len(starts) > 1  # the clients start from models of their own
    sequential = [engine.train_client(job) for job in sequential_jobs]
    other = executor(engine.algorithm, torch.device("cpu"), print)
    results = other.map(engine.train_client, other_jobs)
    assert other.ran == {executor.name}
    for seq, res, seq_job, job in zip(
        sequential, results, sequential_jobs, other_jobs, strict=True
    ):
        assert res.stats.steps == seq.stats.steps
        assert gap(res.state, seq.state) <= ATOL
        assert job.client_state.keys() == seq_job.client_state.keys()
        assert gap(job.client_state, seq_job.client_state) <= ATOL


if __name__ == "__main__":  # this CPU capability's expected digests, from the code on PYTHONPATH
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        found = {case: fingerprint(case, Path(folder) / case) for case in CASES}
    recorded = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    GOLDEN.write_text(json.dumps(recorded | {CAPABILITY: found}, indent=1) + "\n")
    sys.exit(0)
