"""VHL integration: the cached `virtual` stage, the VHL objective on the baselines, its variants,
evaluation on the natural classes, and a tiny end-to-end run."""

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import CliRunner, write_spec
from PIL import Image
from rich.console import Console
from torch import nn

from fedhet.core.errors import InputError
from fedhet.core.pipeline import RunContext, ensure
from fedhet.core.rng import torch_generator
from fedhet.core.spec import Spec, parse_spec
from fedhet.core.store import ArtifactStore
from fedhet.engine.loop import Engine, evaluate
from fedhet.engine.setup import build_setup
from fedhet.engine.system import num_local_steps
from fedhet.engine.trainer import ClientJob, Trainer
from fedhet.execution.planning import runs_of
from fedhet.execution.results import execute
from fedhet.methods.vhl.augment import crop_and_flip
from fedhet.methods.vhl.config import NoiseSpec
from fedhet.methods.vhl.generators import noise_images
from fedhet.methods.vhl.virtual_stage import load_virtual

torch.set_num_threads(1)

NOISE = {"kind": "noise", "per_class": 4}
BASE = {
    "name": "vhl-tiny",
    "seed": 3,
    "data": {"dataset": "digits"},
    "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.5},
    "model": {"arch": "mlp", "hidden": [16]},
    "federation": {"rounds": 2, "batch_size": 12, "lr": 0.05, "local_steps": 3},
    "algorithm": {"name": "fedavg"},
    "runtime": {"threads": 1, "progress": False, "device": "cpu"},
}
C = 10  # digits classes


def spec_with(algorithm: dict, **sections) -> Spec:
    data = copy.deepcopy(BASE) | sections
    data["algorithm"] = algorithm
    return parse_spec(data)


def vhl(name: str = "fedavg", algo: dict | None = None, **options) -> dict:
    return {"name": name, **(algo or {}), "vhl": {"generator": NOISE, **options}}


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> ArtifactStore:
    return ArtifactStore(tmp_path_factory.mktemp("vhl-store"))


def make(spec: Spec, store: ArtifactStore) -> Trainer:
    """The run's trainer with its upstream artifacts in place, as the train stage builds it."""
    node = runs_of(spec)[0].node
    ctx = RunContext(spec, store, Console(quiet=True))
    for up in node.upstream.values():
        ensure(up, ctx)
    setup = build_setup(spec, ctx.upstream(node, "partition"))
    for role in node.upstream:
        setup.extras[role] = ctx.upstream(node, role)
    return spec.algorithm.trainer_class()(spec.algorithm, setup)


def job(algorithm: Trainer, model: nn.Module, global_state: dict | None = None) -> ClientJob:
    """Client 0's job of round 0; its generator is the same in every job."""
    state = global_state or {k: v.detach().clone() for k, v in model.state_dict().items()}
    client = algorithm.setup.clients[0]
    steps = num_local_steps(algorithm.fed, client.n)
    sgd = algorithm.client_sgd(0, client, 0.05)
    return ClientJob(0, client, model, state, {}, {}, sgd, torch_generator(0, "test"), steps)


def batch(algorithm: Trainer, size: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    client = algorithm.setup.clients[0]
    return client.x[:size], client.y[:size]


def reference_supcon(features: torch.Tensor, labels: torch.Tensor, t: float = 0.07):
    """SupCon L_out, anchor by anchor (anchors without a positive left out)."""
    z = F.normalize(features, dim=1)
    losses = []
    for i in range(len(z)):
        positives = [p for p in range(len(z)) if p != i and labels[p] == labels[i]]
        if not positives:
            continue
        others = torch.stack([z[i] @ z[a] / t for a in range(len(z)) if a != i])
        log_denominator = torch.logsumexp(others, 0)
        losses.append(-torch.stack([z[i] @ z[p] / t - log_denominator for p in positives]).mean())
    return torch.stack(losses).mean()


# --- the virtual stage and its key ------------------------------------------------------


def virtual_key(spec: Spec) -> str:
    return runs_of(spec)[0].node.upstream["virtual"].key


@pytest.mark.parametrize(
    "generator, named",
    [({"kind": "gan"}, "generator.kind"), ({**NOISE, "channels": 8}, "generator.noise.channels")],
)
def test_an_unknown_generator_or_option_is_refused_naming_it(generator: dict, named: str):
    with pytest.raises(InputError, match=f"algorithm.vhl.{named}"):
        spec_with(vhl(generator=generator))


def test_virtual_key_depends_only_on_generator_config_seed_and_data_shape():
    base = spec_with(vhl())
    federated_elsewise = spec_with(
        vhl("fedprox", {"mu": 0.3}, alpha=0.5, lam=2.0, batch_size=5),
        partition={"scheme": "classes", "clients": 6, "classes_per_client": 2},
        federation={"rounds": 9, "batch_size": 4, "lr": 0.2, "clients_per_round": 3},
    )
    assert virtual_key(federated_elsewise) == virtual_key(base)
    assert runs_of(federated_elsewise)[0].node.key != runs_of(base)[0].node.key
    assert virtual_key(spec_with(vhl(seed=3))) == virtual_key(base)  # the spec's seed is 3
    changed = [
        spec_with(vhl(generator={**NOISE, "sample_std": 0.1})),
        spec_with(vhl(generator={**NOISE, "per_class": 5})),
        spec_with(vhl(classes=7)),
        spec_with(vhl(seed=4)),
        spec_with(vhl(), seed=5),
        spec_with(vhl(), data={"dataset": "fmnist"}),  # another image shape
    ]
    assert len({virtual_key(s) for s in changed} | {virtual_key(base)}) == len(changed) + 1


def test_runs_without_virtual_images_have_no_virtual_stage():
    for algorithm in ({"name": "fedavg"}, vhl(variant="vfa"), {"name": "centralized"}):
        assert "virtual" not in runs_of(spec_with(algorithm))[0].node.upstream


def test_virtual_artifact_holds_the_generated_images(store):
    algorithm = make(spec_with(vhl(classes=3)), store)
    images, labels = load_virtual(algorithm.setup.extras["virtual"])
    assert images.shape == (3 * NOISE["per_class"], 1, 8, 8) and images.dtype == torch.float32
    assert labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4


# --- config, model and labels -----------------------------------------------------------


def test_labels_and_off_option_leaving_the_config_as_before():
    assert spec_with(vhl()).algorithm.label() == "FedAvg+VHL (noise generator)"
    assert spec_with({"name": "fedprox", "vhl": {"variant": "naive"}}).algorithm.label() == (
        "FedProx+naive VHL"
    )
    assert spec_with({"name": "scaffold", "vhl": {"variant": "vfa"}}).algorithm.label() == (
        "SCAFFOLD+VFA"
    )
    plain = spec_with({"name": "fednova"}).algorithm
    assert plain.label() == "FedNova" and plain.model_dump() == {"name": "fednova"}


@pytest.mark.parametrize(
    "options, outputs",
    [({}, 2 * C), ({"classes": 3}, C + 3), ({"labels": "shared"}, C), ({"variant": "vfa"}, C)],
)
def test_head_gets_extra_outputs_only_for_extra_virtual_labels(store, options, outputs):
    assert make(spec_with(vhl(**options)), store).build_model().head.out_features == outputs


def test_shared_labels_with_more_virtual_than_natural_classes_is_an_input_error():
    with pytest.raises(InputError, match="algorithm.vhl.classes"):
        runs_of(spec_with(vhl(labels="shared", classes=C + 1)))


# --- the objective ----------------------------------------------------------------------


def test_vhl_objective_equals_a_direct_computation(store):
    algorithm = make(spec_with(vhl(alpha=0.7, lam=1.3)), store)
    model = algorithm.build_model()
    x, y = batch(algorithm)
    x_v, y_v = algorithm.objective.virtual_batch(len(y), torch_generator(0, "test"))
    z = model.features(torch.cat([x, x_v]))
    logits, n = model.head(z), len(y)
    expected = (
        F.cross_entropy(logits[:n], y)
        + 0.7 * F.cross_entropy(logits[n:], y_v + C)
        + 1.3 * reference_supcon(torch.cat([z[:n], z[n:]]), torch.cat([y, y_v]))
        + 0.1 * reference_supcon(z[n:], y_v)
    )
    loss = algorithm.local_loss(job(algorithm, model), model, x, y)  # same generator seed
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)


def test_no_gradient_reaches_the_virtual_path_through_the_calibration_term(store):
    algorithm = make(spec_with(vhl()), store)
    model = algorithm.build_model()
    x, y = batch(algorithm)
    x_v, y_v = algorithm.objective.virtual_batch(len(y), torch_generator(0, "test"))
    x_v = x_v.clone().requires_grad_(True)
    terms = algorithm.objective.virtual_terms(model, x, y, x_v, y_v)
    n = len(y)
    calibration = terms.parts["calibration"]
    by_feature = torch.autograd.grad(calibration, terms.features, retain_graph=True)[0]
    assert by_feature[n:].abs().max() == 0 and by_feature[:n].abs().max() > 0
    (by_image,) = torch.autograd.grad(calibration, x_v, retain_graph=True, allow_unused=True)
    assert by_image is None or by_image.abs().max() == 0
    # the same check does see the virtual path when a term uses it
    virtual_only = torch.autograd.grad(terms.parts["virtual_supcon"], terms.features)[0]
    assert virtual_only[n:].abs().max() > 0


def test_naive_vhl_has_no_calibration_term(store):
    naive = make(spec_with(vhl(variant="naive", lam=5.0, alpha=0.5)), store)
    model = naive.build_model()
    x, y = batch(naive)
    x_v, y_v = naive.objective.virtual_batch(len(y), torch_generator(0, "test"))
    terms = naive.objective.virtual_terms(model, x, y, x_v, y_v)
    assert set(terms.parts) == {"real_ce", "virtual_ce"}
    logits, n = model(torch.cat([x, x_v])), len(y)
    expected = F.cross_entropy(logits[:n], y) + 0.5 * F.cross_entropy(logits[n:], y_v + C)
    torch.testing.assert_close(terms.total, expected, rtol=1e-6, atol=1e-7)


def test_fedprox_with_vhl_adds_the_proximal_term_to_the_vhl_objective(store):
    """One local step away from the global model: FedProx's minus FedAvg's (both VHL) is the
    proximal gradient step, -lr mu (w - w_global)."""
    one_step = {"rounds": 1, "batch_size": 12, "lr": 0.05, "local_steps": 1}
    fedprox = make(spec_with(vhl("fedprox", {"mu": 0.5}), federation=one_step), store)
    fedavg = make(spec_with(vhl(), federation=one_step), store)
    model = fedavg.build_model()
    x, y = batch(fedavg)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch_generator(1, "perturb")))
    moved = {k: v.clone() for k, v in model.state_dict().items()}
    vhl_loss = fedprox.local_loss(job(fedprox, model, start), model, x, y)
    assert vhl_loss > F.cross_entropy(model(x)[:, :C], y) + 1e-3  # the VHL objective, not CE
    after = {}
    for name, algorithm in (("fedavg", fedavg), ("fedprox", fedprox)):
        model.load_state_dict(moved)
        after[name] = algorithm.client_update(job(algorithm, model, start)).state
    for name, _ in model.named_parameters():
        proximal_step = 0.05 * 0.5 * (moved[name] - start[name])
        torch.testing.assert_close(
            after["fedprox"][name], after["fedavg"][name] - proximal_step, rtol=0, atol=1e-6
        )


def test_scaffold_with_vhl_still_applies_the_control_correction(store):
    one_step = {"rounds": 1, "batch_size": 12, "lr": 0.1, "local_steps": 1}
    scaffold = make(spec_with(vhl("scaffold"), federation=one_step), store)
    fedavg = make(spec_with(vhl(), federation=one_step), store)
    model = fedavg.build_model()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    control = {n: torch.full_like(p, 0.5) for n, p in model.named_parameters()}
    after = {}
    for name, algorithm, server_state in (("fedavg", fedavg, {}), ("scaffold", scaffold, control)):
        model.load_state_dict(start)
        the_job = job(algorithm, model)
        the_job.server_state = server_state
        the_job.sgd = algorithm.client_sgd(0, the_job.client, 0.1)
        after[name] = algorithm.client_update(the_job).state
    for name in control:  # one SGD step: w_scaffold = w_fedavg - lr * (c - c_i), c_i = 0
        torch.testing.assert_close(after["scaffold"][name], after["fedavg"][name] - 0.05)


def reference_crop_and_flip(images: torch.Tensor, offsets, flips, padding: int = 4):
    """Image by image: zero-pad, take the H x W window at the offset, mirror if flipped."""
    height, width = images.shape[2:]
    out = []
    for image, (dy, dx), flip in zip(images, offsets, flips, strict=True):
        window = F.pad(image, (padding,) * 4)[:, dy : dy + height, dx : dx + width]
        out.append(window.flip(-1) if flip else window)
    return torch.stack(out)


def test_crop_and_flip_shifts_and_mirrors_each_image_by_its_own_draw():
    images = torch.randn(64, 2, 6, 5, generator=torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(1)
    offsets = torch.randint(0, 9, (2, 64), generator=generator).T.tolist()
    flips = (torch.rand(64, generator=generator) < 0.5).tolist()
    out = crop_and_flip(images, torch.Generator().manual_seed(1))
    torch.testing.assert_close(out, reference_crop_and_flip(images, offsets, flips), rtol=0, atol=0)
    assert 0 < sum(flips) < 64 and len({tuple(o) for o in offsets}) > 20


@pytest.mark.parametrize("augment", [True, False])
def test_virtual_batches_are_augmented_at_every_draw_unless_turned_off(store, augment):
    algorithm = make(spec_with(vhl(augment=augment)), store)
    objective = algorithm.objective
    x_v, y_v = objective.virtual_batch(200, torch_generator(0, "test"))
    idx = torch.randint(len(objective.labels), (200,), generator=torch_generator(0, "test"))
    torch.testing.assert_close(y_v, objective.labels[idx])
    identical = (x_v == objective.images[idx]).flatten(1).all(1)
    if augment:  # unshifted and unflipped with probability 1/162
        assert identical.float().mean() < 0.05
    else:
        assert identical.all()


def test_vfa_calibrates_against_class_balanced_gaussian_features(store):
    vfa = make(spec_with(vhl(variant="vfa", lam=0.8)), store)
    means = vfa.objective.gaussian_means
    assert means.shape == (C, vfa.build_model().feature_dim)
    assert means.min() >= 0 and means.max() <= 1
    again = make(spec_with(vhl(variant="vfa")), store).objective.gaussian_means
    other = make(spec_with(vhl(variant="vfa"), seed=4), store).objective.gaussian_means
    assert torch.equal(means, again) and not torch.equal(means, other)

    sampled, labels = vfa.objective.gaussian_features(400, torch_generator(0, "test"))
    assert torch.bincount(labels).tolist() == [41] * C  # 400 // 10 + 1 per class
    for c in range(C):
        torch.testing.assert_close(sampled[labels == c].mean(0), means[c], atol=0.03, rtol=0)

    model = vfa.build_model()
    x, y = batch(vfa)
    sampled, labels = vfa.objective.gaussian_features(len(y), torch_generator(0, "test"))
    z = model.features(x)
    expected = F.cross_entropy(model.head(z), y) + 0.8 * reference_supcon(
        torch.cat([z, sampled]), torch.cat([y, labels])
    )
    loss = vfa.local_loss(job(vfa, model), model, x, y)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)


# --- evaluation and end to end ----------------------------------------------------------


def test_evaluation_scores_only_the_natural_classes():
    model = nn.Linear(2, 4)  # outputs 0, 1 natural; 2, 3 virtual and dominant
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]))
        model.bias.copy_(torch.tensor([0.0, 0.0, 10.0, 10.0]))
    x, y = torch.tensor([[2.0, 0.0], [0.0, 2.0]]), torch.tensor([0, 1])
    assert evaluate(model, x, y, num_classes=2)[0] == 1.0
    assert evaluate(model, x, y)[0] == 0.0


def test_tiny_vhl_run_is_deterministic_and_accounts_the_virtual_broadcast(tmp_path):
    spec = spec_with(vhl())
    first = execute(runs_of(spec)[0], ArtifactStore(tmp_path / "a"))
    second = execute(runs_of(spec)[0], ArtifactStore(tmp_path / "b"))
    for name, values in first["metrics"].arrays():
        if name != "wall_time":
            np.testing.assert_array_equal(values[:], second["metrics"][name][:])
    for name, values in first["model"]["final"].arrays():
        np.testing.assert_array_equal(values[:], second["model"]["final"][name][:])
    accuracy = first["metrics"]["test_accuracy"][:]
    assert np.isfinite(accuracy).all()

    images, labels = load_virtual(ArtifactStore(tmp_path / "a").open("virtual", virtual_key(spec)))
    broadcast = images.numel() * 4 + labels.numel() * 8
    bytes_down = first["metrics"]["bytes_down"][:]
    assert bytes_down[0] - bytes_down[1] == BASE["partition"]["clients"] * broadcast

    execute(runs_of(spec_with(vhl("fedprox")))[0], ArtifactStore(tmp_path / "a"))
    stages = [a.stage for a in ArtifactStore(tmp_path / "a").ls()]
    assert stages.count("virtual") == 1 and stages.count("train") == 2


def test_cli_virtual_writes_a_grid_and_rejects_specs_without_vhl(fedhet: CliRunner, tmp_path):
    spec_file = write_spec(tmp_path / "vhl.yaml", {**BASE, "algorithm": vhl(classes=3)})
    grid = tmp_path / "grid.png"
    result = fedhet("virtual", spec_file, "--grid", grid, "--store", tmp_path / "store")
    assert result.rc == 0, result.stderr
    assert virtual_key(spec_with(vhl(classes=3)))[:12] in result.stdout
    width, height = Image.open(grid).size
    assert height < width  # 3 rows (classes) of 4 samples

    plain = write_spec(tmp_path / "plain.yaml", BASE)
    result = fedhet("virtual", plain, "--store", tmp_path / "store")
    assert result.rc == 2 and "algorithm.vhl" in result.stderr


# --- the official code's input format ---------------------------------------------------

OFFICIAL_FORMAT = {"dataset": "digits", "channels": 3, "resize": 12, "scale": "unit"}
BN_CNN = {"arch": "simple_cnn", "norm": "batch", "channels": [4, 4], "fc_width": 8}


def test_virtual_images_take_the_formatted_input_shape_and_official_scale(store):
    official = spec_with(vhl(virtual_scale="clamp"), data=OFFICIAL_FORMAT, model=BN_CNN)
    assert runs_of(official)[0].node.upstream["virtual"].config["shape"] == [3, 12, 12]
    assert "scale" not in runs_of(spec_with(vhl()))[0].node.upstream["virtual"].config
    algorithm = make(official, store)
    images, labels = load_virtual(algorithm.setup.extras["virtual"])
    raw = noise_images(NoiseSpec(per_class=NOISE["per_class"]), C, (3, 12, 12), 3)  # seed: 3
    torch.testing.assert_close(images, (raw.clamp(0, 1) - 0.5) / 0.25)
    assert images.min() >= -2 and images.max() <= 2
    # the authors pad their [0, 1] images with black before normalizing: -2 here
    drawn, _ = algorithm.objective.virtual_batch(64, torch_generator(0, "pad"))
    assert drawn.min() == -2 and (drawn == -2).float().mean() > (images == -2).float().mean()


def test_batch_norm_sees_real_and_virtual_rows_in_one_forward(store):
    algorithm = make(spec_with(vhl(), data=OFFICIAL_FORMAT, model=BN_CNN), store)
    model = algorithm.build_model().train()
    first_bn = next(m for m in model.modules() if isinstance(m, nn.BatchNorm2d))
    seen = []
    first_bn.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0].detach()))
    x, y = batch(algorithm)
    algorithm.local_loss(job(algorithm, model), model, x, y)
    (rows,) = seen  # one forward ...
    assert len(rows) == 2 * len(y)  # ... of the real and the virtual batch
    expected = first_bn.momentum * rows.mean(dim=(0, 2, 3))  # running mean started at 0
    torch.testing.assert_close(first_bn.running_mean, expected)


def test_predict_all_lets_a_virtual_output_win_the_argmax():
    model = nn.Linear(2, 2 * C)  # the natural outputs favour the right class by 1 ...
    with torch.no_grad():
        model.weight.zero_()
        model.weight[0, 0] = model.weight[1, 1] = 1.0
        model.bias.zero_()
        model.bias[C] = 5.0  # ... and virtual class 0 dominates everything
    x, y = torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1])
    for predict, outputs, accuracy in ("natural", C, 1.0), ("all", 2 * C, 0.0):
        spec = spec_with(vhl(predict=predict))
        assert spec.algorithm.scored_outputs(C) == outputs
        test_set = SimpleNamespace(test_x=x, test_y=y, num_classes=C)
        engine = SimpleNamespace(setup=SimpleNamespace(dataset=test_set, extras={}), spec=spec)
        engine.model = model
        assert Engine.evaluate_states(engine, [model.state_dict()])[0] == accuracy
    assert spec_with({"name": "fedavg"}).algorithm.scored_outputs(C) == C
