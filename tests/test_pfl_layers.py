"""The personalized methods that split the model by layers or fine-tune it (issue 48), each by its
defining property, and all of them through the command line:

- fedper: with no personal layer it is FedAvg, bit for bit; with one, the server's head never
  moves and each client keeps its own.
- lgfedavg: the shared (top) layers are FedAvg's average of them; the local layers never leave
  the clients (the server's copies stay the initial ones, bytes up count the shared part only).
- fedrep: a client's head after a round is its previous head trained alone (body frozen) for
  the head's steps, by a reference loop.
- fedbabu: the head never changes during federation, on either client executor; fine-tuning 0
  steps gives every client the global model.
- fedrod: the balanced softmax loss in closed form; a zero personalized head predicts as the
  generic model; the personalized loss sends no gradient into the body or the generic head.
- finetune: 0 steps is the global model; k steps are k SGD steps of the global model on the
  client's data, by a reference loop.
- fedhet eval: every client is scored on its own test set, the never sampled included; the
  weighted mean weighs clients by their training samples.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import write_spec

from fedhet.core.architectures import parameter_layers
from fedhet.core.rng import torch_generator
from fedhet.core.spec import load_spec, parse_spec
from fedhet.core.store import ArtifactStore
from fedhet.data.client_test import draw_client_tests
from fedhet.data.datasets import load_dataset
from fedhet.data.partition import make_partition
from fedhet.engine import tensors
from fedhet.engine.local import batch_schedule
from fedhet.engine.loop import Engine
from fedhet.engine.run_format import read_client_states
from fedhet.engine.schedule import round_lr
from fedhet.execution.planning import runs_of
from fedhet.execution.results import execute
from fedhet.metrics.accuracy import client_spread
from fedhet.models import build_model
from fedhet.reports.evaluation import evaluate_run

torch.set_num_threads(1)
SPEC = {
    "name": "pfl-layers",
    "seed": 3,
    "data": {"dataset": "digits"},
    "partition": {"scheme": "classes", "clients": 4, "classes_per_client": 3},
    "model": {"arch": "mlp", "hidden": [16]},
    "federation": {"rounds": 2, "batch_size": 16, "lr": 0.1, "local_steps": 3},
    "runtime": {"threads": 1, "progress": False, "device": "cpu", "clients": "sequential"},
}
METHODS = [
    {"name": "fedper"},
    {"name": "lgfedavg"},
    {"name": "fedrep", "head_epochs": 0.2},
    {"name": "fedbabu", "finetune_steps": 3},
    {"name": "fedrod"},
    {"name": "finetune", "finetune_steps": 3},
]
HEAD = ("head.weight", "head.bias")


def engine(algorithm: dict, folder, **sections) -> Engine:
    data = SPEC | {"algorithm": algorithm}
    for name, values in sections.items():
        data[name] = data[name] | values
    return Engine.from_spec(parse_spec(data), folder)


def trained(algorithm: dict, folder, **sections):
    """(engine, initial global state, final run state)."""
    e = engine(algorithm, folder, **sections)
    initial = tensors.clone(e.initial_state().global_state)
    return e, initial, e.run()


def equal(a: dict, b: dict, names=None) -> bool:
    return all(torch.equal(a[n], b[n]) for n in names or a)


# --- the layers personal layers are counted in -----------------------------------------------


@pytest.mark.parametrize(
    ("model", "layers"),
    [
        ({"arch": "mlp", "hidden": []}, ["head"]),
        ({"arch": "mlp", "hidden": [16, 8]}, ["features.hidden1", "features.hidden2", "head"]),
        ({"arch": "simple_cnn"}, ["features.conv1", "features.conv2", "features.fc1", "head"]),
        (
            {"arch": "resnet20", "width": 4},
            ["features.stem", "features.layer1", "features.layer2", "features.layer3", "head"],
        ),
    ],
)
def test_parameter_layers_partition_the_models_parameters(model, layers):
    """Every parameter of the built model belongs to exactly one of the described layers."""
    spec = parse_spec(SPEC | {"model": model})
    assert parameter_layers(spec.model) == layers
    names = [n for n, _ in build_model(spec.model, (1, 8, 8), 10, 0).named_parameters()]
    for name in names:
        assert sum(name.startswith(f"{layer}.") for layer in layers) == 1, name
    assert all(any(n.startswith(f"{layer}.") for n in names) for layer in layers)


# --- fedper and lgfedavg ----------------------------------------------------------------------


def test_fedper_without_personal_layers_is_fedavg_bit_for_bit(tmp_path):
    _, _, fedavg = trained({"name": "fedavg"}, tmp_path / "a")
    _, _, fedper = trained({"name": "fedper", "personal_layers": 0}, tmp_path / "b")
    assert equal(fedper.global_state, fedavg.global_state)
    for name, values in fedavg.metrics.items():
        if name != "wall_time":
            assert fedper.metrics[name] == values, name


def test_fedper_keeps_each_clients_head_and_averages_the_base(tmp_path):
    _, _, fedavg = trained({"name": "fedavg"}, tmp_path / "a", federation={"rounds": 1})
    _, initial, fedper = trained({"name": "fedper"}, tmp_path / "b", federation={"rounds": 1})
    base = [n for n in initial if not n.startswith("head.")]
    assert equal(fedper.global_state, fedavg.global_state, base)  # round 1: the same clients
    assert equal(fedper.global_state, initial, HEAD)  # the server's head never moves
    heads = [s["head.weight"] for s in fedper.client_states.values()]
    assert len(heads) == 4 and not torch.equal(heads[0], heads[1])
    assert set(fedper.client_states[0]) == set(HEAD)  # all a client keeps


def test_lgfedavg_averages_the_shared_layers_and_keeps_the_local_ones(tmp_path):
    e, initial, state = trained({"name": "lgfedavg"}, tmp_path / "lg", federation={"rounds": 1})
    _, _, fedavg = trained({"name": "fedavg"}, tmp_path / "avg", federation={"rounds": 1})
    local = [n for n in initial if n.startswith("features.")]
    # round 1 starts every client from the initial model: the shared head is FedAvg's average
    assert equal(state.global_state, fedavg.global_state, HEAD)
    assert equal(state.global_state, initial, local)  # the server never sees the local layers
    for own in state.client_states.values():
        assert set(own) == set(local)
        assert not torch.equal(own[local[0]], fedavg.global_state[local[0]])  # it trained
    shared_bytes = tensors.nbytes({n: initial[n] for n in HEAD})
    assert state.metrics["bytes_up"] == [4.0 * shared_bytes]


# --- fedrep -----------------------------------------------------------------------------------


def test_fedrep_head_is_its_previous_head_trained_alone(tmp_path):
    e = engine({"name": "fedrep", "head_epochs": 0.3}, tmp_path)
    state, fed, seed = e.initial_state(), e.spec.federation, e.spec.seed
    initial = tensors.clone(state.global_state)
    for rnd in range(fed.rounds):
        body = tensors.clone(state.global_state)
        previous = {c: tensors.clone(own) for c, own in state.client_states.items()}
        e.run_round(rnd, state)
        for cid, own in state.client_states.items():
            model = e.algorithm.build_model()
            model.load_state_dict({**body, **previous.get(cid, {n: initial[n] for n in HEAD})})
            head = [model.head.weight, model.head.bias]
            optimizer = torch.optim.SGD(head, lr=round_lr(fed, rnd))
            client = e.setup.clients[cid]
            steps = math.ceil(0.3 * client.n / fed.batch_size)
            generator = torch_generator(seed, "local", rnd, cid)
            for idx in batch_schedule(client.n, fed.batch_size, steps, generator):
                optimizer.zero_grad()
                F.cross_entropy(model(client.x[idx]), client.y[idx]).backward()
                optimizer.step()
            assert torch.equal(own["head.weight"], model.head.weight.detach()), (rnd, cid)
            assert torch.equal(own["head.bias"], model.head.bias.detach()), (rnd, cid)
    assert equal(state.global_state, initial, HEAD)
    assert not equal(state.global_state, initial)  # the body did move


# --- fedbabu and finetune ---------------------------------------------------------------------


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_fedbabu_head_never_changes_during_federation(executor, tmp_path):
    e, initial, state = trained(
        {"name": "fedbabu", "finetune_steps": 0}, tmp_path, runtime={"clients": executor}
    )
    assert equal(state.global_state, initial, HEAD)
    assert not equal(state.global_state, initial)
    # fine-tuning 0 steps: every client's model is the global one
    evaluated = e.algorithm.evaluation_states(state.global_state, state.client_states)
    assert len(evaluated) == 4 and all(equal(s, state.global_state) for s in evaluated)


def test_fedbabu_head_finetuning_moves_the_head_alone(tmp_path):
    e, _, state = trained({"name": "fedbabu", "finetune_steps": 4, "finetune": "head"}, tmp_path)
    for tuned in e.algorithm.evaluation_states(state.global_state, state.client_states):
        body = [n for n in tuned if not n.startswith("head.")]
        assert equal(tuned, state.global_state, body)
        assert not torch.equal(tuned["head.weight"], state.global_state["head.weight"])


def test_finetune_is_k_sgd_steps_of_the_global_model(tmp_path):
    steps = 5
    e, _, state = trained({"name": "finetune", "finetune_steps": steps}, tmp_path)
    _, _, fedavg = trained({"name": "fedavg"}, tmp_path / "avg")
    assert equal(state.global_state, fedavg.global_state)  # trained as FedAvg
    tuned = e.algorithm.evaluation_states(state.global_state, state.client_states)
    fed = e.spec.federation
    for cid, own in zip(sorted(state.client_states), tuned, strict=True):
        model = e.algorithm.build_model()
        model.load_state_dict(state.global_state)
        optimizer = torch.optim.SGD(model.parameters(), lr=fed.lr)
        client = e.setup.clients[cid]
        generator = torch_generator(e.spec.seed, "finetune", cid)
        for idx in batch_schedule(client.n, fed.batch_size, steps, generator):
            optimizer.zero_grad()
            F.cross_entropy(model(client.x[idx]), client.y[idx]).backward()
            optimizer.step()
        assert equal(own, model.state_dict()), cid
    none = engine({"name": "finetune", "finetune_steps": 0}, tmp_path / "zero").algorithm
    zero = none.evaluation_states(state.global_state, state.client_states)
    assert all(equal(s, state.global_state) for s in zero)


# --- fedrod -----------------------------------------------------------------------------------


def test_balanced_softmax_closed_form():
    from fedhet.methods.fedrod.algorithm import balanced_softmax_loss, log_prior

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    labels = torch.tensor([0, 1, 1, 3, 3, 3])
    counts = np.bincount(labels.numpy(), minlength=4).astype(float)  # class 2 absent
    prior = log_prior(labels, 4)
    # -log(n_y exp(g_y) / sum_c n_c exp(g_c)), averaged
    g = logits.numpy()
    expected = np.mean(
        [
            -np.log(counts[y] * np.exp(g[i, y]) / (counts * np.exp(g[i])).sum())
            for i, y in enumerate(labels.numpy())
        ]
    )
    assert float(balanced_softmax_loss(logits, labels, prior)) == pytest.approx(expected, rel=1e-12)
    assert float(balanced_softmax_loss(logits, labels, prior)) == pytest.approx(
        float(F.cross_entropy(logits + prior, labels)), rel=1e-15
    )


def test_fedrod_zero_personal_head_predicts_as_the_generic_model(tmp_path):
    e = engine({"name": "fedrod"}, tmp_path)
    model = e.algorithm.build_model()
    x = e.setup.clients[0].x[:32]
    assert torch.equal(model(x), model.net(x))  # the personalized head starts at zero


def test_fedrod_losses_train_their_own_heads(tmp_path):
    """The generic side gets the balanced softmax's gradients alone, the personalized head the
    personalized cross-entropy's alone."""
    from fedhet.methods.fedrod.algorithm import balanced_softmax_loss, log_prior

    e, _, state = trained({"name": "fedrod"}, tmp_path)
    trainer, client = e.algorithm, e.setup.clients[1]
    model = trainer.build_model()
    model.load_state_dict(trainer.own_model(state.global_state, state.client_states[1]))
    x, y = client.x[:32], client.y[:32]
    prior = log_prior(client.y, 10).float()

    def gradients(loss: torch.Tensor) -> dict:
        model.zero_grad()
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    job = type("Job", (), {"context": prior})()
    both = gradients(trainer.local_loss(job, model, x, y))
    generic = gradients(balanced_softmax_loss(model.net(x), y, prior))
    assert set(generic) == {n for n in both if n.startswith("net.")}
    for name, grad in generic.items():
        assert torch.allclose(both[name], grad, atol=1e-7), name
    assert not torch.equal(both["personal.weight"], torch.zeros_like(both["personal.weight"]))
    assert equal(state.global_state, trainer.build_model().state_dict(), ["personal.weight"])


# --- state and evaluation --------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", METHODS[:3] + METHODS[4:5], ids=lambda a: a["name"])
def test_a_resumed_run_ends_as_the_run_that_never_stopped(algorithm, tmp_path):
    """The clients' own layers are part of the checkpoint: resuming after round 2 of 3 ends with
    the same global model and the same clients' layers, bit for bit."""
    sections = {"federation": {"rounds": 3, "clients_per_round": 2}}
    whole = engine(algorithm, tmp_path, runtime={"checkpoint_every": 1}, **sections).run()
    again = engine(algorithm, tmp_path, runtime={"checkpoint_every": 1}, **sections)
    start = again.initial_state()
    assert start.round == 2 and start.client_states
    resumed = again.run(start)
    assert equal(resumed.global_state, whole.global_state)
    assert set(resumed.client_states) == set(whole.client_states)
    for cid, own in whole.client_states.items():
        assert equal(resumed.client_states[cid], own), cid


def test_a_never_sampled_client_is_scored_with_the_generic_model(tmp_path):
    """FedRoD with one client a round for two rounds: the clients never sampled are scored, on
    their own test sets, with the generic model (their personalized head is still zero)."""
    federation = SPEC["federation"] | {"clients_per_round": 1}
    eval_section = {"client_test": {"per_client": 40}}
    data = SPEC | {"algorithm": {"name": "fedrod"}, "federation": federation, "eval": eval_section}
    spec = parse_spec(data)
    (run,) = runs_of(spec)
    store = ArtifactStore(tmp_path / "store")
    group = execute(run, store)
    report = evaluate_run(run, group, store)
    never = sorted(set(range(4)) - set(read_client_states(group["model"])))
    assert never  # at most two of the four clients trained
    final = tensors.load(group["model"], "final", "cpu")
    generic = Engine.from_spec(spec, tmp_path / "e").algorithm.build_model().net
    net = {n.removeprefix("net."): v for n, v in final.items() if n.startswith("net.")}
    generic.load_state_dict(net)
    digits = load_dataset("digits")
    part = make_partition(spec.partition, digits.train_y.numpy(), 10, spec.seed)
    tests = draw_client_tests(part.histogram, digits.test_y.numpy(), 40, spec.seed)
    for cid in never:
        with torch.no_grad():
            predicted = generic(digits.test_x[tests[cid]]).argmax(1)
        expected = float((predicted == digits.test_y[tests[cid]]).double().mean())
        assert report["client_test"][cid] == pytest.approx(expected, abs=1e-12), cid


# --- the spread over clients ------------------------------------------------------------------


def test_weighted_mean_weighs_clients_by_their_training_samples():
    spread = client_spread([0.5, math.nan, 1.0, 0.2], weights=[100, 7, 300, 600])
    assert spread.weighted_mean == pytest.approx((50 + 300 + 120) / 1000)
    assert spread.mean == pytest.approx(1.7 / 3)
    assert client_spread([0.5, 0.9]).weighted_mean == pytest.approx(0.7)  # no weights: the mean


# --- the command line -------------------------------------------------------------------------


def test_each_method_validates_trains_and_scores_every_client_on_its_own_test_set(fedhet, tmp_path):
    """Through the command line: validate, train and eval (its table lists the spread of every
    run); the stored runs' reports then hold every client's accuracy on its own test set, those
    never sampled included, and the weighted mean over them."""
    path = write_spec(
        tmp_path / "spec.yaml",
        SPEC
        | {
            # one client a round for two rounds: at least two of the four are never sampled
            "federation": SPEC["federation"] | {"clients_per_round": 1},
            "eval": {"client_test": {"per_client": 40}},
            "matrix": {"algorithm": METHODS},
        },
    )
    store = ArtifactStore(tmp_path / "store")
    valid = fedhet("spec", "validate", path)
    assert valid.rc == 0 and "6 runs" in valid.stdout, valid.stdout + valid.stderr
    table = fedhet("eval", path, "--train", "--store", store.root)
    assert table.rc == 0, table.stderr
    assert table.stdout.count("weighted mean") == len(METHODS), table.stdout
    sizes = [c.n for c in engine({"name": "fedavg"}, tmp_path / "e").setup.clients]
    for run in runs_of(load_spec(path)):
        report = evaluate_run(run, store.open("train", run.node.key), store)
        scores = report["client_test"]
        assert len(scores) == 4 and not any(math.isnan(s) for s in scores), run.label
        assert report["client_test_mean"] == pytest.approx(np.mean(scores), abs=1e-12)
        weighted = np.average(scores, weights=sizes)
        assert report["client_test_weighted_mean"] == pytest.approx(weighted, abs=1e-12)
        assert report["client_test_worst_decile"] == min(scores)


@pytest.mark.parametrize(
    ("algorithm", "hidden", "says"),
    [
        ({"name": "fedper", "personal_layers": 2}, [16], "algorithm.personal_layers: 2"),
        ({"name": "fedrep", "personal_layers": 2}, [16], "algorithm.personal_layers: 2"),
        ({"name": "lgfedavg", "global_layers": 2}, [16], "algorithm.global_layers: 2"),
        ({"name": "lgfedavg"}, [], "give it hidden layers"),  # logistic regression: one layer
        ({"name": "fedbabu", "finetune": "body"}, [16], "algorithm.finetune"),
        ({"name": "finetune", "finetune_steps": -1}, [16], "algorithm.finetune_steps"),
    ],
)
def test_a_bad_option_is_refused_in_one_line_naming_it(fedhet, tmp_path, algorithm, hidden, says):
    model = {"arch": "mlp", "hidden": hidden}
    spec = write_spec(tmp_path / "bad.yaml", SPEC | {"algorithm": algorithm, "model": model})
    result = fedhet("spec", "validate", spec)
    assert result.rc == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert says in result.stderr
