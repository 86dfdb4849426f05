"""FedBR: pseudo-data (RSM, Mixture) as a cached stage, L_con, the max/min steps, phi_g frozen."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from rich.console import Console

from fedhet.core.pipeline import STAGES, RunContext, ensure
from fedhet.core.registry import configs
from fedhet.core.rng import torch_generator
from fedhet.core.spec import ModelSpec, parse_spec
from fedhet.core.store import ArtifactStore
from fedhet.engine.local import SGDSettings
from fedhet.engine.loop import Engine
from fedhet.engine.setup import build_setup
from fedhet.engine.system import num_local_steps
from fedhet.engine.trainer import ClientJob, Trainer
from fedhet.methods.fedbr.algorithm import (
    FedBR,
    LocalRound,
    contrastive_loss,
    projection_head,
)
from fedhet.methods.fedbr.config import FedBRConfig, pseudo_node
from fedhet.methods.fedbr.pseudo import mix_with_local, random_sample_means, to_shape
from fedhet.models import build_model
from fedhet.plugin import WithPart

torch.set_num_threads(1)

BASE = {
    "seed": 3,
    "data": {"dataset": "digits"},
    "partition": {"scheme": "dirichlet", "clients": 4, "alpha": 0.5, "rotation": {"step": 30}},
    "model": {"arch": "mlp", "hidden": [16]},
    "federation": {"rounds": 2, "batch_size": 8, "lr": 0.05, "local_steps": 3},
    "algorithm": {"name": "fedbr", "pseudo": {"size": 6, "subset": 5}},
    "runtime": {"threads": 1, "progress": False, "device": "cpu"},
}


def make_spec(**changes):
    data = copy.deepcopy(BASE)
    for section, value in changes.items():
        merge = isinstance(value, dict) and section != "algorithm"
        data[section] = {**data[section], **value} if merge else value
    return parse_spec(data)


def plan(spec):
    return spec.algorithm.plan(spec)


def context(spec, tmp_path):
    return RunContext(spec, ArtifactStore(tmp_path / "store"), Console(quiet=True))


def setup_with_pseudo(spec, tmp_path):
    ctx = context(spec, tmp_path)
    node = plan(spec)
    setup = build_setup(spec, ensure(node.upstream["partition"], ctx))
    if "pseudo" in node.upstream:
        setup.extras["pseudo"] = ensure(node.upstream["pseudo"], ctx)
    return setup


def job_for(algo, setup, client, state, server_state, rnd=0):
    model = algo.build_model()
    model.load_state_dict(state)
    gen = torch_generator(setup.spec.seed, "local", rnd, client)
    data = setup.clients[client]
    steps = num_local_steps(setup.spec.federation, data.n)
    return ClientJob(
        rnd, data, model, state, server_state, {}, algo.client_sgd(rnd, data, 0.05), gen, steps
    )


def tiny_fedbr_model(seed=0, **config):
    net = build_model(ModelSpec(arch="mlp", hidden=[16]), (1, 8, 8), 10, seed)
    model = WithPart(net, "projection", projection_head(16, 32, 8, seed))
    return model, FedBRConfig(**config)


def fixed_batch(seed=0, real=12, pseudo=6):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(real, 1, 8, 8, generator=gen)
    y = torch.randint(0, 10, (real,), generator=gen)
    x_pseudo = torch.randn(pseudo, 1, 8, 8, generator=gen)
    return x, y, x_pseudo, torch.full((pseudo, 10), 0.1)


# --- pseudo-data --------------------------------------------------------------------------


def test_rsm_samples_are_means_of_subset_local_samples_of_one_client(tmp_path):
    spec = make_spec()
    ctx = context(spec, tmp_path)
    group = ensure(pseudo_node(spec.algorithm.pseudo, spec), ctx)
    x, y = torch.from_numpy(group["x"][...]), torch.from_numpy(group["y"][...])
    source, members = group["source"][...], group["members"][...]
    clients = build_setup(spec, ensure(plan(spec).upstream["partition"], ctx)).clients
    assert x.shape == (6, 1, 8, 8) and members.shape == (6, 5)
    for j in range(len(x)):
        client = clients[int(source[j])]
        idx = torch.from_numpy(members[j])
        assert len(set(members[j].tolist())) == 5 and int(idx.max()) < client.n
        # the client's own (rotated) samples, not the raw dataset's
        torch.testing.assert_close(x[j], client.x[idx].mean(0), rtol=0, atol=1e-6)
    torch.testing.assert_close(y, torch.full((6, 10), 0.1))
    assert len(set(source.tolist())) > 1  # clients drawn at random, one per sample


def test_rsm_draws_only_from_clients_large_enough_and_rejects_impossible_subset():
    pools = [torch.randn(3, 1, 2, 2), torch.randn(50, 1, 2, 2)]
    means = random_sample_means(pools, 20, 4, torch.Generator().manual_seed(0))
    assert set(means.source.tolist()) == {1}
    with pytest.raises(Exception, match="pseudo.subset"):
        random_sample_means(pools, 2, 51, torch.Generator().manual_seed(0))


def test_mixture_is_eq4_average_with_local_samples():
    gen = torch.Generator().manual_seed(1)
    proxy = torch.randn(5, 1, 4, 4)
    local_x, local_y = torch.randn(7, 1, 4, 4), torch.randint(0, 3, (7,))
    x, y = mix_with_local(proxy, local_x, local_y, 3, 2, gen)
    idx = torch.randint(7, (5, 2), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(x, (proxy + local_x[idx[:, 0]] + local_x[idx[:, 1]]) / 3)
    one_hot = F.one_hot(local_y[idx], 3).sum(1)
    torch.testing.assert_close(y, (1 / 3 + one_hot) / 3)
    torch.testing.assert_close(y.sum(1), torch.ones(5))
    same, uniform = mix_with_local(proxy, local_x, local_y, 3, 0, gen)
    assert same is proxy and torch.allclose(uniform, torch.full((5, 3), 1 / 3))


def test_proxy_conversion_commutes_with_averaging():
    samples = torch.randn(6, 3, 8, 8)
    converted = to_shape(samples, (1, 28, 28))
    assert converted.shape == (6, 1, 28, 28)
    torch.testing.assert_close(
        to_shape(samples.mean(0, keepdim=True), (1, 28, 28))[0],
        converted.mean(0),
        rtol=0,
        atol=1e-6,
    )


def test_pseudo_artifact_is_reused_across_runs_sharing_its_config(tmp_path, monkeypatch):
    calls = []
    original = STAGES["pseudo"]
    monkeypatch.setitem(STAGES, "pseudo", lambda *a: (calls.append(1), original(*a)))
    first = make_spec()
    # different federated and FedBR settings, same pseudo-data config
    second = make_spec(
        federation={"rounds": 7, "lr": 0.01},
        algorithm={"name": "fedbr", "pseudo": {"size": 6, "subset": 5}, "max_step": False},
    )
    a, b = plan(first).upstream["pseudo"], plan(second).upstream["pseudo"]
    assert a.key == b.key and plan(first).key != plan(second).key
    ensure(a, context(first, tmp_path))
    ensure(b, context(second, tmp_path))
    assert len(calls) == 1
    other = make_spec(algorithm={"name": "fedbr", "pseudo": {"size": 6, "subset": 4}})
    assert plan(other).upstream["pseudo"].key != a.key
    assert plan(make_spec(seed=4)).upstream["pseudo"].key != a.key


def test_mixture_pseudo_key_ignores_the_partition():
    mixture = {"name": "fedbr", "pseudo": {"kind": "mixture", "size": 6}}
    one = make_spec(algorithm=mixture)
    two = make_spec(algorithm=mixture, partition={"alpha": 0.1})
    assert "partition" not in plan(one).upstream["pseudo"].upstream
    assert plan(one).upstream["pseudo"].key == plan(two).upstream["pseudo"].key


def test_size_defaults_to_one_batch_and_ablation_labels_differ():
    spec = make_spec(algorithm={"name": "fedbr"})
    assert pseudo_node(spec.algorithm.pseudo, spec).config["size"] == 8
    variants = [
        {},
        {"debias_features": False},
        {"debias_classifier": False},
        {"debias_classifier": False, "max_step": False},
        {"max_step": False},
        {"tau1": 0.5, "tau2": 0.5},
    ]
    labels = {FedBRConfig(**v).label() for v in variants}
    assert len(labels) == len(variants) and "FedBR" in labels
    assert (
        "pseudo"
        not in plan(
            make_spec(
                algorithm={"name": "fedbr", "debias_classifier": False, "debias_features": False}
            )
        ).upstream
    )


# --- the local objective ------------------------------------------------------------------


def test_contrastive_loss_matches_direct_computation():
    gen = torch.Generator().manual_seed(0)
    local_p, global_p = torch.randn(4, 5, generator=gen), torch.randn(4, 5, generator=gen)
    real = torch.randn(3, 5, generator=gen)
    tau1, tau2 = 2.0, 0.7

    def cos(a, b):
        return float(a @ b) / (float(a.norm()) * float(b.norm()))

    terms = []
    for j in range(4):
        f1 = math.exp(cos(local_p[j], global_p[j]) / tau1)
        for k in range(3):
            f2 = math.exp(cos(local_p[j], real[k]) / tau2)
            terms.append(-math.log(f1 / (f1 + f2)))
    expected = sum(terms) / len(terms)
    assert float(contrastive_loss(local_p, global_p, real, tau1, tau2)) == pytest.approx(
        expected, rel=1e-5
    )


def test_index_pairing_with_tau_half_is_the_official_loss():
    """The official code: pseudo i paired with real i, cosines multiplied by tau = 2; here
    divided by 0.5. A pseudo batch longer than the real one pairs its first samples."""
    gen = torch.Generator().manual_seed(1)
    local_p, global_p = torch.randn(5, 6, generator=gen), torch.randn(5, 6, generator=gen)
    real = torch.randn(4, 6, generator=gen)
    positive = F.cosine_similarity(local_p[:4], global_p[:4], dim=1) * 2.0
    negative = F.cosine_similarity(local_p[:4], real, dim=1) * 2.0
    official = -torch.log(torch.exp(positive) / (torch.exp(positive) + torch.exp(negative)))
    ours = contrastive_loss(local_p, global_p, real, 0.5, 0.5, pairing="index")
    assert float(ours) == pytest.approx(float(official.mean()), rel=1e-6)
    every_pair = contrastive_loss(local_p, global_p, real, 0.5, 0.5)
    assert float(every_pair) != pytest.approx(float(ours), rel=1e-3)


def test_index_pairing_is_omitted_from_keys_by_default_and_labelled():
    default, paired = FedBRConfig(), FedBRConfig(pairing="index")
    assert "pairing" not in default.model_dump(mode="json")
    assert paired.label() == "FedBR (index pairs)"
    assert default.label() == "FedBR"


def _features(local, x, x_pseudo):
    net = local.model.net
    return net.features(x), net.features(x_pseudo), local.global_pseudo_features(x_pseudo)


def test_max_step_increases_contrastive_loss_and_moves_only_the_projection():
    model, config = tiny_fedbr_model()
    local = LocalRound(model, config, SGDSettings(0.05))
    with torch.no_grad():  # the local extractor has moved away from phi_g
        for p in model.net.features.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    x, _, x_pseudo, _ = fixed_batch()
    z, z_pseudo, z_global = _features(local, x, x_pseudo)
    before_net = copy.deepcopy(model.net.state_dict())
    before = local.contrastive(z_pseudo, z_global, z).item()
    local.max_step(z_pseudo, z_global, z)
    after = local.contrastive(z_pseudo, z_global, z).item()
    assert after > before
    for name, value in model.net.state_dict().items():
        assert torch.equal(value, before_net[name])


def test_min_step_decreases_min_objective_and_leaves_projection():
    model, config = tiny_fedbr_model()
    local = LocalRound(model, config, SGDSettings(0.01))
    x, y, x_pseudo, y_pseudo = fixed_batch()
    projection = copy.deepcopy(model.projection.state_dict())
    features = _features(local, x, x_pseudo)
    before, _ = local.min_loss(features, y, y_pseudo)
    local.min_step(before)
    after, _ = local.min_loss(_features(local, x, x_pseudo), y, y_pseudo)
    assert after.item() < before.item()
    for name, value in model.projection.state_dict().items():
        assert torch.equal(value, projection[name])


def test_global_feature_extractor_is_frozen_within_a_round():
    model, config = tiny_fedbr_model()
    initial = copy.deepcopy(model.net.features.state_dict())
    local = LocalRound(model, config, SGDSettings(0.1))
    x, y, x_pseudo, y_pseudo = fixed_batch()
    for _ in range(4):
        local.step(x, y, x_pseudo, y_pseudo)
    assert not local.global_pseudo_features(x_pseudo).requires_grad
    for name, p in local.global_features.named_parameters():
        assert not p.requires_grad and p.grad is None
        assert torch.equal(p, initial[name])
    moved = any(not torch.equal(p, initial[n]) for n, p in model.net.features.state_dict().items())
    assert moved  # the local extractor trained while phi_g stayed put


# --- the algorithm in a round -------------------------------------------------------------


def test_fedbr_without_components_is_fedavg(tmp_path):
    spec = make_spec(
        algorithm={"name": "fedbr", "debias_classifier": False, "debias_features": False}
    )
    setup = setup_with_pseudo(spec, tmp_path)
    fedbr = FedBR(spec.algorithm, setup)
    fedavg = Trainer(configs()["fedavg"](), setup)
    state = fedbr.build_model().state_dict()
    plain = {k.removeprefix("net."): v for k, v in state.items() if k.startswith("net.")}
    ours = fedbr.client_update(job_for(fedbr, setup, 1, state, {}))
    theirs = fedavg.client_update(job_for(fedavg, setup, 1, plain, {}))
    for name, value in theirs.state.items():
        assert torch.equal(ours.state["net." + name], value)
    for name, value in ours.state.items():
        if name.startswith("projection."):
            assert torch.equal(value, state[name])


def test_projection_trains_locally_and_is_averaged_and_pseudo_sent_once(tmp_path):
    spec = make_spec()
    setup = setup_with_pseudo(spec, tmp_path)
    algo = FedBR(spec.algorithm, setup)
    state = algo.build_model().state_dict()
    server = algo.init_server_state(state)
    assert torch.equal(
        algo.download(0, server)["pseudo_x"], torch.from_numpy(setup.extras["pseudo"]["x"][...])
    )
    results = [algo.client_update(job_for(algo, setup, c, state, server)) for c in (0, 2)]
    weights = [0.25, 0.75]
    new = algo.aggregate(0, state, server, results, weights)
    name = "projection.0.weight"
    assert not torch.equal(results[0].state[name], state[name])
    torch.testing.assert_close(
        new[name], 0.25 * results[0].state[name] + 0.75 * results[1].state[name]
    )
    assert algo.download(1, server) == {}  # transferred once, at the start


def test_refresh_draws_a_new_pseudo_batch_each_round(tmp_path):
    spec = make_spec(
        algorithm={"name": "fedbr", "pseudo": {"size": 6, "subset": 5, "refresh": "round"}}
    )
    setup = setup_with_pseudo(spec, tmp_path)
    algo = FedBR(spec.algorithm, setup)
    stored = torch.from_numpy(setup.extras["pseudo"]["x"][...])
    assert torch.equal(algo.pseudo_x(0), stored)
    assert not torch.allclose(algo.pseudo_x(1), stored)
    assert torch.equal(algo.download(1, {})["pseudo_x"], algo.pseudo_x(1))


def test_resume_from_a_checkpoint_equals_an_uninterrupted_run(tmp_path):
    spec = make_spec(
        algorithm={"name": "fedbr", "pseudo": {"size": 6, "subset": 5, "kind": "mixture"}},
        runtime={"checkpoint_every": 1},
    )
    ctx, node = context(spec, tmp_path), plan(spec)
    partition, pseudo = (ensure(node.upstream[role], ctx) for role in ("partition", "pseudo"))
    folder = tmp_path / "partial"
    straight = Engine.from_spec(spec, folder, partition, extras={"pseudo": pseudo}).run()
    assert sorted(p.name for p in folder.glob("ckpt-*")) == ["ckpt-000001.zarr"]
    resumed = Engine.from_spec(spec, folder, partition, extras={"pseudo": pseudo}).run()
    for name, value in straight.global_state.items():
        assert torch.equal(resumed.global_state[name], value)
    assert straight.metrics["bytes_down"][0] > straight.metrics["bytes_down"][1]


def test_rotated_partition_rotates_the_test_set_like_the_clients(tmp_path):
    """Test image i is rotated by client (i mod K)'s angle; the key says so."""
    from fedhet.data.datasets import load_dataset, rotate
    from fedhet.engine.train_plan import train_config

    spec = make_spec()
    setup = setup_with_pseudo(spec, tmp_path)
    plain = load_dataset("digits")
    angles = [0.0, 30.0, 60.0, 90.0]
    for i in (0, 1, 2, 3, 6, 7):
        expected = rotate(plain.test_x[i : i + 1], angles[i % 4], plain.mean, plain.std)
        assert torch.allclose(setup.dataset.test_x[i : i + 1], expected, atol=1e-6)
    # FedBR's code resamples rotated pixels by their nearest neighbour (PIL's default)
    nearest = make_spec(partition={"rotation": {"step": 30, "interpolation": "nearest"}})
    turned = setup_with_pseudo(nearest, tmp_path).dataset.test_x[1:2]
    expected = rotate(plain.test_x[1:2], 30.0, plain.mean, plain.std, "nearest")
    assert torch.equal(turned, expected) and not torch.allclose(turned, setup.dataset.test_x[1:2])
    fill = torch.tensor([-plain.mean[0] / plain.std[0]])
    assert torch.isin(turned, torch.cat([plain.test_x[1].flatten(), fill])).all()  # no blending
    assert not torch.equal(setup.dataset.test_x[1], plain.test_x[1])
    assert torch.equal(plain.test_x, load_dataset("digits").test_x)  # the cached set is untouched
    unrotated = make_spec(partition={"rotation": None})
    assert "test_set" in train_config(spec) and "test_set" not in train_config(unrotated)
    assert torch.equal(setup_with_pseudo(unrotated, tmp_path).dataset.test_x, plain.test_x)
