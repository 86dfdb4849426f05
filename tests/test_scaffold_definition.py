"""SCAFFOLD's control variates against their definition (Karimireddy et al., option II).

One round from live controls (a first round makes c and the c_i non-zero; with partial
participation c_i - c differs from client to client), checked against an independent replay of
each sampled client's corrected local SGD:

    y_i   = K corrected steps from x (gradient form: grad + c - c_i before each step;
            after_step form: param -= lr (c - c_i) after each step)
    c_i+  = c_i - c + (x - y_i) / (a lr)   a = effective_steps(K, momentum) (gradient form),
                                             a = K (after_step form); lr = the round's lr
    c+    = c + sum_{i sampled} (n_i / n) (c_i+ - c_i),   n = all clients' samples
    x+    = sum_{i sampled} n_i y_i / sum_{i sampled} n_i
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedhet.core.rng import torch_generator
from fedhet.core.spec import Spec, parse_spec
from fedhet.engine import tensors
from fedhet.engine.local import batch_schedule, effective_steps
from fedhet.engine.loop import Engine, sample_holders

torch.set_num_threads(1)
STEPS = 3


def scaffold_spec(momentum: float, correction: str) -> Spec:
    return parse_spec(
        {
            "seed": 4,
            "partition": {"scheme": "dirichlet", "clients": 5, "alpha": 0.3},
            "model": {"arch": "mlp", "hidden": [8]},
            "federation": {
                "rounds": 2,
                "clients_per_round": 3,
                "batch_size": 32,
                "lr": 0.1,
                "lr_decay": 0.9,
                "local_steps": STEPS,
                "momentum": momentum,
            },
            "algorithm": {"name": "scaffold", "correction": correction},
            "runtime": {"progress": False},
        }
    )


def replay_client(engine: Engine, x, c, c_i, cid: int, rnd: int, lr: float, correction: str):
    """y_i: the client's K corrected SGD steps from x, written from the definition."""
    fed, client = engine.spec.federation, engine.setup.clients[cid]
    model = engine.algorithm.build_model()
    model.load_state_dict(x)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=fed.momentum)
    generator = torch_generator(engine.spec.seed, "local", rnd, cid)
    for idx in batch_schedule(client.n, fed.batch_size, STEPS, generator):
        optimizer.zero_grad()
        F.cross_entropy(model(client.x[idx]), client.y[idx]).backward()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if correction == "gradient":
                    p.grad += c[name] - c_i[name]
            optimizer.step()
            for name, p in model.named_parameters():
                if correction == "after_step":
                    p -= lr * (c[name] - c_i[name])
    return model.state_dict()


@pytest.mark.parametrize("momentum", [0.0, 0.5])
@pytest.mark.parametrize("correction", ["gradient", "after_step"])
def test_one_round_of_controls_matches_the_definition(tmp_path, momentum, correction):
    engine = Engine.from_spec(scaffold_spec(momentum, correction), tmp_path)
    state = engine.initial_state()
    engine.run_round(0, state)
    x, c = tensors.clone(state.global_state), tensors.clone(state.server_state)
    controls = {cid: tensors.clone(ci) for cid, ci in state.client_states.items()}
    engine.run_round(1, state)

    fed, sizes = engine.spec.federation, engine.setup.sizes
    lr = fed.lr * fed.lr_decay
    a = effective_steps(STEPS, momentum) if correction == "gradient" else STEPS
    sampled = sample_holders(engine.spec.seed, 1, engine.holders, 3)
    expected_c = tensors.clone(c)
    local_models, drift = [], 0.0
    for cid in sampled:
        c_i = controls.get(cid, tensors.zeros_like(c))
        y_i = replay_client(engine, x, c, c_i, cid, 1, lr, correction)
        local_models.append(y_i)
        for name in c:
            new = c_i[name] - c[name] + (x[name] - y_i[name]) / (a * lr)
            torch.testing.assert_close(state.client_states[cid][name], new, rtol=1e-5, atol=1e-6)
            expected_c[name] += sizes[cid] / sum(sizes) * (new - c_i[name])
            drift = max(drift, float((c_i[name] - c[name]).abs().max()))
    assert drift > 1e-2  # c_i - c is live: the check sees the term
    for name in c:
        torch.testing.assert_close(state.server_state[name], expected_c[name], rtol=1e-5, atol=1e-6)
    for cid in set(controls) - set(sampled):
        for name, value in controls[cid].items():
            assert torch.equal(state.client_states[cid][name], value)  # not sampled: unchanged
    weights = [sizes[cid] / sum(sizes[s] for s in sampled) for cid in sampled]
    expected_x = tensors.weighted_average(local_models, weights)
    for name, value in state.global_state.items():
        torch.testing.assert_close(value, expected_x[name], rtol=1e-5, atol=1e-6)
