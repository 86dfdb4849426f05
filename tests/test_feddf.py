"""FedDF (Lin et al. 2020): ensemble distillation on the server's unlabeled data after FedAvg's
average, with real (data.server's held-out training samples) or noise server data.

Defining properties: the loss is KL(ensemble || student) on a hand-built batch; 0 distillation
steps is FedAvg bit for bit; distillation lowers the student's KL to the ensemble on the server
data; the server's real samples are no client's and come from the seed; configs are validated;
both variants train on digits through the CLI. `local_epochs` trains FedDF's clients as the
federation's `local_epochs` would (with 0 distillation steps, FedAvg of those epochs bit for
bit); every round stores the ensemble's and the average's validation accuracy, equal to an
independent computation, and the API shows them in percent.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import markdown_tables

from fedhet import load
from fedhet.core.errors import InputError
from fedhet.core.spec import parse_spec
from fedhet.core.store import ArtifactStore
from fedhet.data.partition_plan import partition_node
from fedhet.data.partition_stage import spec_partition
from fedhet.engine.loop import Engine
from fedhet.engine.setup import build_setup
from fedhet.engine.trainer import Trainer
from fedhet.methods.feddf.algorithm import (
    FedDF,
    distillation_loss,
    ensemble_probs,
    noise_batch,
)

torch.set_num_threads(1)
FEDHET = Path(sys.executable).with_name("fedhet")  # the installed console script
SERVER = 300


def raw(algorithm: dict, **data) -> dict:
    return {
        "seed": 3,
        "data": {"dataset": "digits", "server": SERVER, "validation": 0.1, **data},
        "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.5},
        "model": {"arch": "mlp", "hidden": [16]},
        "federation": {"rounds": 2, "batch_size": 32, "lr": 0.05, "local_steps": 5},
        "algorithm": algorithm,
        "runtime": {"progress": False, "threads": 1, "device": "cpu"},
    }


def run(tmp_path: Path, algorithm: dict, trainer=None):
    spec = parse_spec(raw(algorithm))
    engine = Engine.from_spec(spec, tmp_path / spec.algorithm.label(), trainer=trainer)
    return engine, engine.run()


# --- the loss ---------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_loss_is_kl_from_the_ensemble_to_the_student_on_a_hand_built_batch(temperature):
    teachers = [
        torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]]),
        torch.tensor([[-1.0, 1.0, 0.0], [4.0, -2.0, 0.0]]),
    ]
    student = torch.tensor([[0.3, -0.2, 1.0], [1.0, 2.0, -1.0]])

    def softmax(z):
        e = [math.exp(v / temperature) for v in z]
        return [v / sum(e) for v in e]

    def kl(p, q):
        return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))

    for ensemble in ("logits", "probs"):
        expected = 0.0
        for i in range(2):
            if ensemble == "logits":
                p = softmax(
                    [(a + b) / 2 for a, b in zip(*(t[i].tolist() for t in teachers), strict=True)]
                )
            else:
                p = [
                    (a + b) / 2
                    for a, b in zip(*(softmax(t[i].tolist()) for t in teachers), strict=True)
                ]
            expected += kl(p, softmax(student[i].tolist())) / 2
        target = ensemble_probs(teachers, ensemble, temperature)
        assert target.sum(1).tolist() == pytest.approx([1.0, 1.0])
        loss = distillation_loss(student, target, temperature)
        assert float(loss) == pytest.approx(expected, rel=1e-6)
    logits, probs = (ensemble_probs(teachers, e, temperature) for e in ("logits", "probs"))
    assert not torch.allclose(logits, probs)  # the two teachers are different distributions


def test_loss_is_zero_when_the_student_is_the_teacher():
    z = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    assert float(distillation_loss(z, ensemble_probs([z, z], "logits", 2.0), 2.0)) < 1e-6


# --- FedAvg as the limit, and what distillation does ------------------------------------


def test_zero_distillation_steps_is_fedavg_bit_for_bit(tmp_path):
    _, fedavg = run(tmp_path, {"name": "fedavg"})
    _, zero = run(tmp_path, {"name": "feddf", "steps": 0})
    _, some = run(tmp_path, {"name": "feddf", "steps": 5, "patience": None})
    for name, value in fedavg.global_state.items():
        assert torch.equal(value, zero.global_state[name]), name
    assert fedavg.metrics["test_accuracy"] == zero.metrics["test_accuracy"]
    assert any(not torch.equal(v, some.global_state[n]) for n, v in fedavg.global_state.items())


class Recording(FedDF):
    """FedDF that keeps each round's average, client states and distilled student."""

    rounds: list

    def aggregate(self, round, global_state, server_state, results, weights):
        averaged = Trainer.aggregate(self, round, global_state, server_state, results, weights)
        distilled = super().aggregate(round, global_state, server_state, results, weights)
        self.rounds.append((averaged, [r.state for r in results], distilled))
        return distilled


@torch.no_grad()
def kl_to_ensemble(trainer: FedDF, student, clients, x) -> float:
    cfg = trainer.config
    target = ensemble_probs(
        [trainer.loaded(s).eval()(x) for s in clients], cfg.ensemble, cfg.temperature
    )
    return float(distillation_loss(trainer.loaded(student).eval()(x), target, cfg.temperature))


@pytest.mark.parametrize("server_data", ["real", "noise"])
def test_distillation_lowers_the_students_kl_to_the_ensemble_on_the_server_data(
    tmp_path, server_data
):
    Recording.rounds = []
    algorithm = {"name": "feddf", "server_data": server_data, "steps": 30, "patience": None}
    engine, _ = run(tmp_path, algorithm, trainer=Recording)
    trainer = engine.algorithm
    if server_data == "real":
        x = engine.setup.server.x
    else:  # a fresh draw of the same noise
        ds = engine.setup.dataset
        x = noise_batch(256, ds.shape, ds.mean, ds.std, torch.Generator().manual_seed(1))
    assert len(Recording.rounds) == 2
    for averaged, clients, distilled in Recording.rounds:
        before = kl_to_ensemble(trainer, averaged, clients, x)
        after = kl_to_ensemble(trainer, distilled, clients, x)
        assert after < 0.8 * before, (before, after)


def test_early_stopping_keeps_the_best_checked_student(tmp_path):
    """With patience, the student kept is the first best checked one on the validation split,
    and a round stops `patience` steps after it."""
    checks: list[list[float]] = []

    class Watched(FedDF):
        def validator(self):
            check, scores = super().validator(), []
            checks.append(scores)
            return lambda model: scores.append(check(model)) or scores[-1]

    algorithm = {"name": "feddf", "steps": 400, "eval_every": 2, "patience": 4}
    engine, state = run(tmp_path, algorithm, trainer=Watched)
    assert len(checks) == 2
    last = checks[-1]
    final = FedDF.validator(engine.algorithm)(engine.algorithm.loaded(state.global_state))
    assert final == max(last)
    assert any(len(scores) < 200 for scores in checks)  # some round stopped early
    for scores in checks:
        if len(scores) < 200:
            assert len(scores) - 1 - scores.index(max(scores)) == 4 // 2


# --- the official local epochs and the per-round log -----------------------------------


def test_local_epochs_train_feddfs_clients_as_the_federations_epochs_would(tmp_path):
    epochs = {"federation": {"local_steps": None, "local_epochs": 2}}
    spec = raw({"name": "fedavg"})
    spec["federation"] = {**spec["federation"], **epochs["federation"]}
    fedavg = Engine.from_spec(parse_spec(spec), tmp_path / "fedavg").run()
    engine, own = run(tmp_path, {"name": "feddf", "steps": 0, "local_epochs": 2})
    for name, value in fedavg.global_state.items():  # 5 local steps in the federation: not 2
        assert torch.equal(value, own.global_state[name]), name  # epochs, unless FedDF's own
    state = engine.initial_state()
    [job] = engine.make_jobs(0, state, [1])
    n, batch = job.client.n, engine.spec.federation.batch_size
    assert job.steps == 5 and engine.algorithm.local_steps(job) == 2 * math.ceil(n / batch) > 5
    assert engine.train_client(job).stats.steps == 2 * math.ceil(n / batch)
    default = parse_spec(raw({"name": "feddf"})).algorithm
    assert default.local_epochs is None and "local_epochs" not in default.model_dump()
    assert default.label() == "FedDF"
    assert parse_spec(raw({"name": "feddf", "local_epochs": 40})).algorithm.label() == (
        "FedDF (local epochs=40)"
    )


def test_each_round_logs_the_ensembles_and_the_averages_validation_accuracy(tmp_path):
    Recording.rounds = []
    engine, state = run(tmp_path, {"name": "feddf", "steps": 10, "patience": None}, Recording)
    validation, trainer = engine.setup.validation, engine.algorithm
    assert len(Recording.rounds) == 2
    for rnd, (averaged, clients, _) in enumerate(Recording.rounds):
        with torch.no_grad():  # by hand: the argmax of the mean logits, over the split
            logits = torch.stack([trainer.loaded(c).eval()(validation.x) for c in clients])
            ensemble = (logits.mean(0).argmax(1) == validation.y).double().mean()
            average = trainer.loaded(averaged).eval()(validation.x).argmax(1)
        assert state.metrics["ensemble_val_accuracy"][rnd] == pytest.approx(float(ensemble))
        assert state.metrics["average_val_accuracy"][rnd] == float(
            (average == validation.y).double().mean()
        )
    assert len(state.metrics["val_accuracy"]) == 2  # the distilled model's, as every run's
    unvalidated = raw({"name": "feddf", "steps": 5, "patience": None}, validation=None)
    plain = Engine.from_spec(parse_spec(unvalidated), tmp_path / "plain").run()
    assert "ensemble_val_accuracy" not in plain.metrics  # nothing to score them on


# --- server data ------------------------------------------------------------------------


def test_real_server_samples_are_no_clients_and_come_from_the_seed(tmp_path):
    spec = parse_spec(raw({"name": "feddf"}))
    part = spec_partition(spec)
    server = part.server_indices
    clients = np.concatenate(part.client_indices + part.validation_indices)
    assert len(server) == SERVER and len(np.unique(server)) == SERVER
    assert np.intersect1d(server, clients).size == 0
    assert len(server) + len(clients) == len(build_setup(spec).dataset.train_y)
    again = spec_partition(parse_spec(raw({"name": "fedavg"})))  # same data for every method
    assert np.array_equal(again.server_indices, server)
    assert all(
        np.array_equal(a, b) for a, b in zip(again.client_indices, part.client_indices, strict=True)
    )
    other = spec_partition(parse_spec({**raw({"name": "feddf"}), "seed": 4}))
    assert not np.array_equal(other.server_indices, server)
    setup = build_setup(spec, part)  # the server's data: those samples, as the dataset has them
    assert torch.equal(setup.server.x, setup.dataset.train_x[torch.from_numpy(server)])


def test_server_size_is_in_the_partition_key_and_absent_when_off():
    plain = {**raw({"name": "fedavg"}), "data": {"dataset": "digits"}}
    assert "server" not in partition_node(parse_spec(plain)).config
    keys = {partition_node(parse_spec(raw({"name": "fedavg"}, server=n))).key for n in (300, 301)}
    assert len(keys) == 2
    variants = [{"name": "feddf", "server_data": d} for d in ("real", "noise")]
    runs = {parse_spec(raw(v)).algorithm.plan(parse_spec(raw(v))).key for v in variants}
    assert len(runs) == 2


@pytest.mark.parametrize("server_data", ["real", "noise"])
def test_server_batches_are_reproducible_from_the_seed_and_round(server_data):
    spec = parse_spec(raw({"name": "feddf", "server_data": server_data, "batch_size": 64}))
    trainer = FedDF(spec.algorithm, build_setup(spec))
    first, same, other = (trainer.server_batches(r) for r in (0, 0, 1))
    a, b, c = first(), same(), other()
    assert a.shape == (64, *trainer.setup.dataset.shape)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert not torch.equal(a, first())  # the next batch is another
    if server_data == "noise":  # pixel range [0, 1] once the normalization is undone
        ds = trainer.setup.dataset
        pixels = a * torch.tensor(ds.std).view(1, -1, 1, 1) + torch.tensor(ds.mean).view(
            1, -1, 1, 1
        )
        assert float(pixels.min()) == pytest.approx(0, abs=1e-6)
        assert float(pixels.max()) == pytest.approx(1, abs=1e-6)


# --- config validation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("algorithm", "data", "message"),
    [
        ({"name": "feddf"}, {"server": None}, "algorithm.server_data: real distills"),
        ({"name": "feddf"}, {"validation": None}, "algorithm.patience: FedDF's early stopping"),
        ({"name": "feddf", "steps": -1}, {}, "algorithm.steps"),
        ({"name": "feddf", "temperature": 0}, {}, "algorithm.temperature"),
        ({"name": "feddf", "server_data": "fake"}, {}, "algorithm.server_data"),
        ({"name": "feddf", "ensemble": "losses"}, {}, "algorithm.ensemble"),
        ({"name": "fedavg"}, {"server": 0}, "data.server"),
    ],
)
def test_bad_configs_are_refused_naming_the_field(algorithm, data, message):
    spec = raw(algorithm)
    spec["data"] = {k: v for k, v in {**spec["data"], **data}.items() if v is not None}
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        parse_spec(spec)


def test_valid_variants_and_labels():
    noise = parse_spec(
        raw({"name": "feddf", "server_data": "noise", "patience": None}, server=None)
    )
    assert noise.algorithm.label() == "FedDF (noise)"
    assert parse_spec(raw({"name": "feddf"})).algorithm.label() == "FedDF"
    with pytest.raises(InputError, match="data.server: 1438 server samples leave none"):
        spec_partition(parse_spec(raw({"name": "fedavg"}, server=1438, validation=None)))


def cli(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(FEDHET), *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_spec_validate_through_the_installed_cli(tmp_path):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(json.dumps(raw({"name": "feddf"})))
    bad.write_text(json.dumps(raw({"name": "feddf", "server_data": "real"}, server=None)))
    ok = cli("spec", "validate", good, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    refused = cli("spec", "validate", bad, cwd=tmp_path)
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "data.server" in lines[0] and "Traceback" not in refused.stderr


def test_both_variants_train_on_digits_through_the_cli(tmp_path):
    spec = raw({"name": "feddf"})
    spec["federation"]["rounds"] = 3
    spec["matrix"] = {
        "algorithm": [
            {"name": "feddf", "server_data": data, "steps": 20, "eval_every": 5}
            for data in ("real", "noise")
        ]
    }
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(spec))
    done = cli("train", path, "--store", tmp_path / "store", "--format", "json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [r["algorithm"] for r in rows] == ["FedDF", "FedDF (noise)"]
    finals = [r["final_pct"] for r in rows]
    assert all(10 < a <= 100 for a in finals), rows  # above chance on 10 classes
    assert finals[0] != finals[1]  # the server data made a difference
    # the per-round log is stored with the run's metrics and shown in percent
    metrics = load(path, store=tmp_path / "store").metrics()
    for name in ("ensemble_val_accuracy_pct", "average_val_accuracy_pct"):
        shown = metrics[name]
        assert shown.notna().all() and shown.between(0, 100).all() and shown.max() > 10, shown
    assert "ensemble_val_accuracy" not in metrics
    # the stored partition holds the server's samples, as computed from the spec
    run_spec = parse_spec(raw(spec["matrix"]["algorithm"][0]))  # the partition ignores rounds
    node = partition_node(run_spec)
    stored = ArtifactStore(tmp_path / "store").open(node.stage, node.key)["server"]["indices"][:]
    assert np.array_equal(stored, spec_partition(run_spec).server_indices)


def test_report_shows_the_ensemble_the_average_and_the_distilled_model(tmp_path, fedhet):
    spec = raw({"name": "feddf"}) | {"name": "distilled", "eval": {"every": 2}}
    spec["federation"]["rounds"] = 3
    spec["matrix"] = {
        "algorithm": [{"name": "fedavg"}, {"name": "feddf", "steps": 20, "eval_every": 5}],
        "seed": [0, 1],
    }
    path, store = tmp_path / "spec.yaml", tmp_path / "store"
    path.write_text(json.dumps(spec))
    assert fedhet("train", path, store=store).rc == 0
    done = fedhet("report", path, "--out", tmp_path / "report", store=store)
    assert done.rc == 0, done.stderr
    text = (tmp_path / "report" / "distilled.md").read_text()
    section = text.split("## The clients' ensemble, their average and the distilled model")[1]
    table = markdown_tables(section.split("\n## ")[0].splitlines())[0]
    assert [row[0] for row in table[2:]] == ["FedDF"]  # FedAvg logs no ensemble
    # by hand: each seed's mean over its evaluated rounds (2 and 3 of 3), then over the seeds
    metrics = load(path, store=store).metrics()
    feddf = metrics[metrics["algorithm"] == "FedDF"]
    evaluated = feddf[feddf["val_accuracy_pct"].notna()]
    assert sorted(evaluated["round"].unique()) == [2, 3]
    names = ("ensemble_val_accuracy_pct", "average_val_accuracy_pct", "val_accuracy_pct")
    per_seed = evaluated.groupby("seed")[list(names)].mean()
    for column, name in zip(table[2][2:5], names, strict=True):
        mean, std = (float(x) for x in column.split(" (n=2)")[0].split(" ± "))
        assert mean == pytest.approx(per_seed[name].mean(), abs=0.006)
        assert std == pytest.approx(np.std(per_seed[name]), abs=0.006)
    gain = per_seed[names[0]] - per_seed[names[1]]
    assert float(table[2][5].split(" ")[0]) == pytest.approx(gain.mean(), abs=0.006)
