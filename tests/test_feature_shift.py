"""Feature shift beyond rotation (`partition.feature_shift`, fedhet.data.feature_shift): each
transform is its definition, a client's data are fixed and its level's, level 0 is the identity,
the global test set mixes the clients' domains and a client's own test set is in its domain; off
by default, it enters no existing key."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from conftest import TINY_SPEC, write_spec

from fedhet.core.errors import InputError
from fedhet.core.rng import torch_generator
from fedhet.core.spec import Spec, load_spec, parse_spec
from fedhet.core.store import ArtifactStore
from fedhet.data.client_test import client_test_data, draw_client_tests
from fedhet.data.datasets import load_dataset
from fedhet.data.feature_shift import ClientDomains, add_noise, blur, scale_contrast, shift
from fedhet.data.partition_format import save_index_lists, save_partition
from fedhet.data.partition_stage import spec_partition
from fedhet.engine import tensors
from fedhet.engine.setup import build_setup
from fedhet.execution.planning import runs_of

IID = {"scheme": "iid", "clients": 4}
LEVELS = {"noise": [0, 0.1, 0.3, 0.6], "contrast": [0, 0.2, 0.5, 0.9], "blur": [0, 0.5, 1, 2]}


def spec_with(partition: dict, **changes) -> Spec:
    return Spec.model_validate({**TINY_SPEC, "partition": partition, **changes})


def shifted(kind: str, **changes) -> Spec:
    return spec_with({**IID, "feature_shift": {"kind": kind, "levels": LEVELS[kind]}}, **changes)


# --- the transforms, by definition -----------------------------------------------------------


def test_noise_adds_the_seeded_draw_in_pixel_units():
    x = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).view(2, 3, 4, 4) / 10
    std = (0.5, 0.25, 2.0)
    got = add_noise(x, 0.2, torch_generator(7, "t"), std)
    draw = torch.randn(x.shape, generator=torch_generator(7, "t"))
    expected = x + 0.2 * draw / torch.tensor(std).view(1, 3, 1, 1)
    assert torch.equal(got, expected)


def test_contrast_scales_each_images_channel_around_its_mean():
    x = torch.tensor([[[[0.0, 2.0], [4.0, 6.0]], [[1.0, 1.0], [1.0, 5.0]]]])  # means 3 and 2
    got = scale_contrast(x, 0.5)
    expected = torch.tensor([[[[1.5, 2.5], [3.5, 4.5]], [[1.5, 1.5], [1.5, 3.5]]]])
    assert torch.allclose(got, expected, atol=1e-6, rtol=0)
    assert torch.allclose(scale_contrast(x, 1.0), x.mean(dim=(2, 3), keepdim=True).expand_as(x))


def test_blur_spreads_an_impulse_into_the_sampled_gaussian():
    sigma = 1.0
    x = torch.zeros(1, 1, 9, 9)
    x[0, 0, 4, 4] = 1.0
    taps = torch.tensor([math.exp(-(i**2) / (2 * sigma**2)) for i in range(-3, 4)])
    taps /= taps.sum()  # 2 ceil(3 sigma) + 1 = 7 taps
    expected = torch.zeros(9, 9)
    expected[1:8, 1:8] = torch.outer(taps, taps)
    assert torch.allclose(blur(x, sigma)[0, 0], expected, atol=1e-6, rtol=0)


def test_blur_caps_its_kernel_to_the_image_so_vectors_blur_along_their_one_axis():
    vector = torch.zeros(2, 1, 1, 5)  # a tabular sample: D features as 1 x D
    vector[:, 0, 0, 2] = 1.0
    got = blur(vector, 5.0)  # 31 taps wanted, 9 (2 * 5 - 1) at most along the row, 1 across
    assert got.shape == vector.shape and torch.isfinite(got).all() and got[0, 0, 0, 2] < 1.0
    assert torch.allclose(got, got.flip(-1))  # symmetric about the impulse
    constant = torch.full((1, 1, 1, 5), 0.7)  # the weights sum to 1
    assert torch.allclose(blur(constant, 5.0), constant, atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind", ["noise", "contrast", "blur"])
def test_level_zero_is_the_identity(kind):
    x = torch.randn(3, 1, 8, 8, generator=torch_generator(0, "x"))
    assert shift(x, kind, 0.0, torch_generator(0, "g")) is x


# --- the spec ---------------------------------------------------------------------------


def test_max_spreads_levels_evenly_from_zero():
    spec = spec_with({**IID, "feature_shift": {"kind": "blur", "max": 1.5}})
    assert spec.partition.feature_shift.client_levels(4) == [0.0, 0.5, 1.0, 1.5]
    one = spec_with({"scheme": "iid", "clients": 1, "feature_shift": {"kind": "noise", "max": 1}})
    assert one.partition.feature_shift.client_levels(1) == [0.0]


def test_off_by_default_it_enters_no_dump_and_a_shift_changes_the_partition_and_train_keys():
    plain = spec_with(IID)
    assert "feature_shift" not in plain.partition.model_dump(mode="json")
    [plain_run], [noisy_run] = runs_of(plain), runs_of(shifted("noise"))
    for stage in ("partition", "train"):
        plain_keys = {n.stage: n.key for n in plain_run.node.walk()}
        noisy_keys = {n.stage: n.key for n in noisy_run.node.walk()}
        assert plain_keys[stage] != noisy_keys[stage]


@pytest.mark.parametrize(
    ("shift_option", "message"),
    [
        ({"kind": "fog", "max": 1}, "partition.feature_shift.kind: input should be 'noise'"),
        ({"kind": "noise"}, "partition.feature_shift: give either levels"),
        ({"kind": "noise", "max": 1, "levels": [0, 0, 0, 0]}, "partition.feature_shift: give"),
        ({"kind": "blur", "max": -1}, "partition.feature_shift.max: input should be greater"),
        ({"kind": "noise", "levels": [0, -0.1, 0, 0]}, "partition.feature_shift.levels.1:"),
        ({"kind": "contrast", "max": 2}, "max reaches 2.0; contrast levels go up to 1.0"),
        ({"kind": "noise", "levels": [0, 1]}, "feature_shift.levels has 2 entries for 4 clients"),
        ({"kind": "blur", "sigma": 1}, "partition.feature_shift.sigma: unknown field"),
    ],
)
def test_bad_options_are_refused_in_one_line_naming_the_field(shift_option, message):
    spec = {**TINY_SPEC, "partition": {**IID, "feature_shift": shift_option}}
    with pytest.raises(InputError) as caught:
        parse_spec(spec)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_spec_validate_through_the_installed_cli_exits_2_with_one_line(tmp_path):
    spec = {**TINY_SPEC, "partition": {**IID, "feature_shift": {"kind": "fog", "max": 1}}}
    path = write_spec(tmp_path / "bad.yaml", spec)
    script = Path(sys.executable).parent / "fedhet"
    done = subprocess.run([script, "spec", "validate", path], capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "feature_shift.kind" in done.stderr


# --- a run's data -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["noise", "contrast", "blur"])
def test_clients_data_are_fixed_and_shifted_by_their_own_level(kind):
    spec = shifted(kind, data={"dataset": "digits", "validation": 0.2})
    first, second = build_setup(spec), build_setup(spec)
    clean = build_setup(spec_with(IID, data=spec.data.model_dump()))
    for a, b in zip(first.clients, second.clients, strict=True):
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert torch.equal(first.validation.x, second.validation.x)
    assert torch.equal(first.dataset.test_x, second.dataset.test_x)
    assert torch.equal(first.clients[0].x, clean.clients[0].x)  # level 0: bit for bit
    std = torch.tensor(first.dataset.std).view(1, -1, 1, 1)
    changes = []
    for cid in range(1, 4):
        got, plain = first.clients[cid].x, clean.clients[cid].x
        assert not torch.equal(got, plain) and torch.equal(
            first.clients[cid].y, clean.clients[cid].y
        )
        if kind == "noise":  # the added noise's std, back in pixel units, is the client's level
            measured = float(((got - plain) * std).std())
            assert measured == pytest.approx(LEVELS[kind][cid], rel=0.05)
        if kind == "contrast":  # each image's spread shrinks by 1 - level
            ratio = got.std(dim=(2, 3)) / plain.std(dim=(2, 3))
            assert torch.allclose(ratio, torch.full_like(ratio, 1 - LEVELS[kind][cid]), atol=1e-4)
        changes.append(float((got - plain).abs().mean()))
    assert changes == sorted(changes)  # a higher level moves the data further


@pytest.mark.parametrize("kind", ["noise", "blur"])
def test_global_test_set_mixes_the_clients_domains(kind):
    spec = shifted(kind)
    setup = build_setup(spec)
    ds = load_dataset("digits")
    domains = ClientDomains.of(spec, None, ds)
    position = torch.arange(len(ds.test_x))
    for cid in range(4):
        members = position % 4 == cid
        expected = domains.apply(ds.test_x[members], cid, "test")
        assert torch.equal(setup.dataset.test_x[members], expected)
        assert torch.equal(expected, ds.test_x[members]) == (cid == 0)


def test_each_client_test_set_is_in_its_clients_domain(tmp_path):
    spec = shifted("noise")
    ds = load_dataset("digits")
    part = spec_partition(spec)
    partition_group = zarr.open_group(tmp_path / "partition.zarr")
    tests_group = zarr.open_group(tmp_path / "client_test.zarr")
    save_partition(partition_group, part)
    indices = draw_client_tests(part.histogram, ds.test_y.numpy(), 20, spec.seed)
    save_index_lists(tests_group, indices)
    data = client_test_data(spec, partition_group, tests_group, torch.device("cpu"))
    again = client_test_data(spec, partition_group, tests_group, torch.device("cpu"))
    for cid, (client, idx) in enumerate(zip(data, indices, strict=True)):
        clean = ds.test_x[torch.from_numpy(idx)]
        noise = ((client.x - clean) * torch.tensor(ds.std).view(1, -1, 1, 1)).std()
        assert torch.equal(client.x, again[cid].x)
        assert (cid == 0) == torch.equal(client.x, clean)
        if cid:
            assert float(noise) == pytest.approx(LEVELS["noise"][cid], rel=0.1)


def test_rotation_and_a_shift_compose_rotation_first():
    spec = spec_with({**IID, "rotation": {"step": 90}, "feature_shift": {"kind": "contrast",
                                                                          "max": 0.6}})  # fmt: skip
    part = spec_partition(spec)
    setup = build_setup(spec, part)
    ds = load_dataset("digits")
    idx = torch.from_numpy(part.client_indices[3])
    turned = torch.rot90(ds.train_x[idx], 3, dims=(2, 3))
    assert torch.allclose(setup.clients[3].x, scale_contrast(turned, 0.6), atol=1e-6, rtol=0)


# --- through the command line -------------------------------------------------------------


def test_every_kind_trains_from_the_cli_and_zero_levels_train_as_no_shift(fedhet, tmp_path):
    partitions = [
        IID,
        {**IID, "feature_shift": {"kind": "noise", "levels": [0, 0, 0, 0]}},
        *({**IID, "feature_shift": {"kind": k, "levels": LEVELS[k]}} for k in LEVELS),
    ]
    path = write_spec(
        tmp_path / "shift.yaml",
        {
            **TINY_SPEC,
            "eval": {"client_test": {"per_client": 20}},
            "runtime": {"threads": 1, "progress": False, "device": "cpu"},
            "matrix": {"partition": partitions},
        },
    )
    store = tmp_path / "store"
    trained = fedhet("train", path, "--store", store)
    assert trained.rc == 0, trained.stderr
    evaluated = fedhet("eval", path, "--json", "--store", store)
    assert evaluated.rc == 0, evaluated.stderr
    reports = json.loads(evaluated.stdout)
    assert len(reports) == 5 and all(len(r["client_test_pct"]) == 4 for r in reports)
    st = ArtifactStore(store)
    runs = runs_of(load_spec(path))
    finals = [tensors.load(st.open("train", r.node.key)["model"], "final", "cpu") for r in runs]
    plain, zeros, *kinds = finals
    assert plain.keys() == zeros.keys()
    assert all(torch.equal(plain[name], zeros[name]) for name in plain)
    for final in kinds:
        assert not all(torch.equal(plain[name], final[name]) for name in plain)
    assert np.isfinite([r["accuracy_pct"] for r in reports]).all()
