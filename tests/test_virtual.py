"""VHL virtual data generators, the untrained StyleGAN2, and the SupCon / calibration losses."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from sklearn.linear_model import LogisticRegression

from fedhet.core.errors import InputError
from fedhet.methods.vhl.config import ConvSpec, NoiseSpec, StyleGAN2Spec
from fedhet.methods.vhl.generators import generate, save_grid
from fedhet.methods.vhl.stylegan2 import ModulatedConv2d, StyleGAN2Config, StyleGAN2Generator
from fedhet.methods.vhl.supcon import supcon_loss, vhl_calibration_loss

torch.set_num_threads(1)

KINDS = ["stylegan2", "noise", "conv"]
SPECS = {"stylegan2": StyleGAN2Spec, "noise": NoiseSpec, "conv": ConvSpec}
SMALL = {"stylegan2": {"channels": 16}, "noise": {}, "conv": {"channels": 8}}


def small_spec(kind: str, per_class: int):
    return SPECS[kind](per_class=per_class, **SMALL[kind])


def _small(kind: str, seed: int, shape=(3, 32, 32), num_classes=3, per_class=4, **extra):
    return generate(small_spec(kind, per_class), num_classes, shape, seed, **extra)


# --- generators -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_generator_is_deterministic_given_seed_and_differs_across_seeds(kind):
    images, labels = _small(kind, seed=5)
    again, again_labels = _small(kind, seed=5)
    other, _ = _small(kind, seed=6)
    assert torch.equal(images, again) and torch.equal(labels, again_labels)
    assert not torch.allclose(images, other, atol=1e-3)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)])
def test_output_shape_labels_and_per_channel_standardization(kind, shape):
    images, labels = _small(kind, seed=0, shape=shape)
    assert images.shape == (12, *shape)
    assert labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert labels.dtype == torch.int64
    mean = images.mean(dim=(0, 2, 3))
    std = images.std(dim=(0, 2, 3))
    torch.testing.assert_close(mean, torch.zeros(shape[0]), atol=1e-5, rtol=0)
    torch.testing.assert_close(std, torch.ones(shape[0]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["stylegan2", "conv"])
def test_result_does_not_depend_on_batch_size(kind):
    whole, _ = _small(kind, seed=3, per_class=5, batch_size=256)
    batched, _ = _small(kind, seed=3, per_class=5, batch_size=2)
    torch.testing.assert_close(whole, batched, atol=1e-5, rtol=1e-5)


def test_global_rng_is_neither_used_nor_advanced():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    for kind in KINDS:
        _small(kind, seed=0)
    assert torch.equal(torch.rand(3), expected)


def _linear_probe_accuracy(images: torch.Tensor, labels: torch.Tensor) -> float:
    features, targets = images.flatten(1).numpy(), labels.numpy()
    train = np.arange(len(targets)) % 2 == 0
    probe = LogisticRegression(max_iter=2000).fit(features[train], targets[train])
    return probe.score(features[~train], targets[~train])


@pytest.mark.parametrize(
    "shape, channels",
    [((3, 32, 32), 32), ((1, 28, 28), 64)],  # the latter: specs/vhl_fmnist.yaml
)
def test_stylegan2_virtual_classes_are_linearly_separable(shape, channels):
    # Without noise injection (the official untrained generator) only the style means
    # separate the classes: 0.92 measured at 28 x 28 (0.95+ with noise_strength 1).
    images, labels = generate(StyleGAN2Spec(per_class=40, channels=channels), 10, shape, seed=0)
    assert _linear_probe_accuracy(images, labels) >= 0.9


@pytest.mark.parametrize("kind", ["noise", "conv"])
def test_alternative_generators_are_linearly_separable(kind):
    images, labels = generate(small_spec(kind, 20), 10, (3, 16, 16), seed=0)
    assert _linear_probe_accuracy(images, labels) >= 0.95


@pytest.mark.parametrize(
    "kind, options, shape",
    [
        ("stylegan2", {"batch_size": 0}, (3, 32, 32)),
        ("noise", {"num_classes": 0}, (3, 32, 32)),
        ("conv", {}, (3, 2, 32)),
        ("conv", {}, (32, 32)),
    ],
)
def test_bad_requests_are_input_errors(kind, options, shape):
    request = {"num_classes": 2, "shape": shape, "seed": 0} | options
    with pytest.raises(InputError):
        generate(small_spec(kind, 2), **request)


def test_save_grid_draws_one_labelled_row_per_class_large_enough_to_read(tmp_path):
    # three classes of flat images: black, mid-grey and white after min-max scaling
    labels = torch.arange(3).repeat_interleave(5)
    images = (labels.float() / 2)[:, None, None, None].expand(15, 1, 16, 16).clone()
    path = tmp_path / "sub" / "grid.png"
    save_grid(images, labels, path, per_class=4)
    with Image.open(path) as png:
        assert png.format == "PNG"
        pixels = np.asarray(png.convert("L"), dtype=int)
    height, width = pixels.shape
    assert width >= 4 * 100 and height >= 3 * 100  # tiles of at least ~100 px
    rows_black = np.nonzero((pixels == 0).sum(axis=1) > 0.3 * width)[0]
    rows_grey = np.nonzero((abs(pixels - 128) <= 2).sum(axis=1) > 0.3 * width)[0]
    assert rows_black.size > 100 and rows_grey.size > 100  # (tile frames are black lines too)
    assert np.median(rows_black) < rows_grey.min()  # class 0's row above class 1's
    assert np.median(rows_black) < height / 3 < np.median(rows_grey) < 2 * height / 3


# --- StyleGAN2 building blocks ----------------------------------------------------------


def _fused_modulated_conv(conv: ModulatedConv2d, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The StyleGAN2 paper's form: per-sample weights w'_ijk = s_i w_ijk, demodulated by
    sqrt(sum_ik w'^2), applied as a grouped convolution."""
    batch, in_channels, height, width = x.shape
    style = conv.affine(w)
    weight = conv.weight[None] * conv.scale * style[:, None, :, None, None]
    if conv.demodulate:
        weight = weight / torch.sqrt(weight.square().sum(dim=(2, 3, 4), keepdim=True) + 1e-8)
    out_channels, kernel = weight.shape[1], weight.shape[-1]
    out = F.conv2d(
        x.reshape(1, batch * in_channels, height, width),
        weight.reshape(batch * out_channels, in_channels, kernel, kernel),
        padding=kernel // 2,
        groups=batch,
    )
    return out.reshape(batch, out_channels, height, width)


@pytest.mark.parametrize("demodulate", [True, False])
def test_modulated_conv_equals_per_sample_weight_reference(demodulate):
    generator = torch.Generator().manual_seed(0)
    conv = ModulatedConv2d(5, 7, 3, 8, demodulate, generator)
    x = torch.randn(4, 5, 9, 9, generator=generator)
    w = torch.randn(4, 8, generator=generator)
    torch.testing.assert_close(conv(x, w), _fused_modulated_conv(conv, x, w), atol=1e-5, rtol=1e-5)


def test_demodulation_gives_unit_output_std_for_unit_variance_input():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(6, 16, 48, 48, generator=generator)
    w = 3.0 * torch.randn(6, 8, generator=generator)  # large styles: far from unit gain

    def interior_std(demodulate: bool) -> torch.Tensor:
        conv = ModulatedConv2d(16, 12, 3, 8, demodulate, torch.Generator().manual_seed(2))
        with torch.no_grad():
            out = conv(x, w)[:, :, 1:-1, 1:-1]  # away from the zero padding
        return out.std(dim=(2, 3))  # per sample, per output channel

    demodulated = interior_std(True)
    assert torch.all((demodulated - 1).abs() < 0.1), demodulated
    assert (interior_std(False) - 1).abs().mean() > 0.5


def test_stylegan2_generator_builds_at_power_of_two_and_fits_requested_size():
    config = StyleGAN2Config(height=28, width=28, out_channels=1, channels=8)
    network = StyleGAN2Generator(config, seed=0)
    assert config.build_size == 32
    shapes = network.noise_shapes()
    assert shapes == [(4, 4), (8, 8), (8, 8), (16, 16), (16, 16), (32, 32), (32, 32)]
    z = torch.randn(2, config.style_dim, generator=torch.Generator().manual_seed(0))
    noises = [torch.zeros(2, 1, h, w) for h, w in shapes]
    assert network(z, noises).shape == (2, 1, 28, 28)


def test_stylegan2_weights_follow_the_seed():
    config = StyleGAN2Config(channels=8)
    same = [StyleGAN2Generator(config, seed=s).state_dict() for s in (4, 4, 5)]
    assert all(torch.equal(same[0][k], same[1][k]) for k in same[0])
    assert not torch.equal(same[0]["constant"], same[2]["constant"])


def test_noise_injection_and_styles_both_change_the_image():
    config = StyleGAN2Config(channels=8, noise_strength=1.0)
    network = StyleGAN2Generator(config, seed=0)
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(2, config.style_dim, generator=generator)
    noises = [torch.zeros(2, 1, h, w) for h, w in network.noise_shapes()]
    with torch.no_grad():
        base = network(z, noises)
        shifted_noise = network(z, noises[:3] + [noises[3] + 1.0] + noises[4:])
        other_style = network(z.flip(0), noises)
    assert not torch.allclose(base, shifted_noise, atol=1e-4)
    torch.testing.assert_close(other_style, base.flip(0))  # samples are independent
    assert not torch.allclose(base[0], base[1], atol=1e-4)


# --- SupCon ------------------------------------------------------------------------------


def _supcon_reference(features, labels, temperature, anchors=None):
    """Khosla et al. Eq. 2 written out with loops over anchors, positives and contrasts."""
    z = [[v / math.sqrt(sum(u * u for u in f)) for v in f] for f in features.tolist()]
    labels = labels.tolist()
    n = len(z)
    dot = [
        [sum(a * b for a, b in zip(z[i], z[j], strict=True)) / temperature for j in range(n)]
        for i in range(n)
    ]
    losses = []
    for i in range(n):
        if anchors is not None and not anchors[i]:
            continue
        positives = [p for p in range(n) if p != i and labels[p] == labels[i]]
        if not positives:
            continue
        denominator = sum(math.exp(dot[i][a]) for a in range(n) if a != i)
        total = sum(math.log(math.exp(dot[i][p]) / denominator) for p in positives)
        losses.append(-total / len(positives))
    return sum(losses) / len(losses)


@pytest.mark.parametrize("temperature", [0.07, 0.5])
def test_supcon_equals_double_loop_reference(temperature):
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(9, 5, generator=generator, dtype=torch.float64)
    labels = torch.tensor([0, 1, 0, 2, 1, 1, 0, 3, 2])  # class 3 has no positive
    loss = supcon_loss(features, labels, temperature, base_temperature=temperature)
    assert loss.item() == pytest.approx(_supcon_reference(features, labels, temperature), rel=1e-9)


def test_supcon_anchor_mask_and_temperature_scaling():
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(8, 4, generator=generator, dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1, 0, 1, 2, 2])
    anchors = torch.tensor([True, False, True, False, True, True, False, True])
    loss = supcon_loss(features, labels, 0.2, anchors)  # base temperature 0.07
    reference = (0.2 / 0.07) * _supcon_reference(features, labels, 0.2, anchors.tolist())
    assert loss.item() == pytest.approx(reference, rel=1e-9)


def test_supcon_is_scale_invariant_and_reaches_log_positives_on_perfect_clusters():
    generator = torch.Generator().manual_seed(2)
    features = torch.randn(10, 6, generator=generator)
    labels = torch.arange(10) % 2
    torch.testing.assert_close(supcon_loss(features, labels), supcon_loss(7.0 * features, labels))
    # Orthogonal, collapsed class clusters: every contrast outside the class is exp(0) against
    # exp(1/t) inside, so the loss is its infimum log|P(i)| = log 4 up to 5 exp(-1/t) / 4.
    clustered = torch.eye(6)[labels]
    assert supcon_loss(clustered, labels).item() == pytest.approx(math.log(4), abs=1e-5)
    assert supcon_loss(features, labels).item() > math.log(4) + 1.0


def test_supcon_without_any_positive_pair_is_zero_with_gradient_graph():
    features = torch.randn(3, 4, requires_grad=True)
    loss = supcon_loss(features, torch.tensor([0, 1, 2]))
    loss.backward()
    assert loss.item() == 0.0 and torch.all(features.grad == 0)


def _calibration_batch(seed: int):
    generator = torch.Generator().manual_seed(seed)
    real = torch.randn(6, 8, generator=generator, requires_grad=True)
    virtual = torch.randn(6, 8, generator=generator, requires_grad=True)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    return real, virtual, labels


@pytest.mark.parametrize("real_anchors_only", [False, True])
def test_calibration_gives_no_gradient_to_virtual_features(real_anchors_only):
    real, virtual, labels = _calibration_batch(0)
    loss = vhl_calibration_loss(
        real, labels, virtual, labels, 0.07, real_anchors_only=real_anchors_only
    )
    loss.backward()
    assert virtual.grad is None or torch.all(virtual.grad == 0)
    assert real.grad is not None and real.grad.abs().sum() > 0


def test_calibration_equals_supcon_on_the_concatenated_batch():
    real, virtual, labels = _calibration_batch(1)
    expected = supcon_loss(torch.cat([real, virtual]), torch.cat([labels, labels]), 0.1)
    actual = vhl_calibration_loss(real, labels, virtual, labels, 0.1)
    torch.testing.assert_close(actual, expected)


def test_calibration_pairs_real_class_c_with_virtual_class_c():
    # Real features sitting on the virtual feature of their own class score lower than the
    # same real features paired with another class's virtual feature.
    generator = torch.Generator().manual_seed(3)
    virtual_centers = F.normalize(torch.randn(3, 16, generator=generator), dim=1)
    virtual_labels = torch.tensor([0, 1, 2, 0, 1, 2])
    virtual = virtual_centers[virtual_labels] + 0.05 * torch.randn(6, 16, generator=generator)
    real_labels = torch.tensor([0, 1, 2])
    matched = virtual_centers[real_labels] + 0.05 * torch.randn(3, 16, generator=generator)
    mismatched = virtual_centers[(real_labels + 1) % 3] + 0.05 * torch.randn(
        3, 16, generator=generator
    )
    loss_matched = vhl_calibration_loss(matched, real_labels, virtual, virtual_labels)
    loss_mismatched = vhl_calibration_loss(mismatched, real_labels, virtual, virtual_labels)
    assert loss_matched < loss_mismatched - 1.0


def test_noise_has_no_effect_by_default_as_in_the_official_untrained_generator():
    network = StyleGAN2Generator(StyleGAN2Config(channels=8), seed=0)
    z = torch.randn(2, 64, generator=torch.Generator().manual_seed(0))
    zeros = [torch.zeros(2, 1, h, w) for h, w in network.noise_shapes()]
    ones = [torch.ones(2, 1, h, w) for h, w in network.noise_shapes()]
    with torch.no_grad():
        torch.testing.assert_close(network(z, ones), network(z, zeros))
