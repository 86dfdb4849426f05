"""Per-client state lives on the client's job (`Trainer.client_context`), never on the trainer
that the round's clients share: training a round leaves every attribute of the trainer as it
was (no attribute added, none rebound), for every method whose clients train their own way."""

from __future__ import annotations

import pytest
import torch

from fedhet.core.spec import parse_spec
from fedhet.engine.loop import Engine

torch.set_num_threads(1)

METHODS = [
    {"name": "fedavg"},
    {"name": "mixup"},
    {"name": "groupdro", "mixup_alpha": 0.2},
    {"name": "fedmix", "mean_size": 4},
    {"name": "moon", "projection_width": 8},
    {"name": "fedimpro"},
    {"name": "dann"},
    {"name": "local"},
    {"name": "feddyn"},
    {"name": "scaffold"},
    {"name": "ditto"},
    {"name": "pfedme"},
    {"name": "apfl"},
    {"name": "perfedavg", "variant": "hf"},
    {"name": "fedrep", "head_epochs": 0.2},
    {"name": "fedrod"},
]


def engine_for(algorithm: dict, folder) -> Engine:
    spec = parse_spec(
        {
            "seed": 1,
            "data": {"dataset": "digits"},
            "partition": {"scheme": "dirichlet", "clients": 3, "alpha": 0.5},
            "model": {"arch": "simple_cnn"},
            "federation": {"rounds": 3, "batch_size": 16, "lr": 0.05, "local_steps": 2},
            "algorithm": algorithm,
            "runtime": {"progress": False, "clients": "sequential"},
        }
    )
    return Engine.from_spec(spec, folder)


@pytest.mark.parametrize("algorithm", METHODS, ids=[m["name"] for m in METHODS])
def test_a_round_leaves_the_trainer_as_it_was(algorithm, tmp_path):
    engine = engine_for(algorithm, tmp_path)
    state = engine.initial_state()
    engine.run_round(0, state)  # builds what the trainer caches (models, pools, names)
    before = {name: id(value) for name, value in vars(engine.algorithm).items()}
    engine.run_round(1, state)
    after = {name: id(value) for name, value in vars(engine.algorithm).items()}
    assert after == before
