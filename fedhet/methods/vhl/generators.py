"""VHL's labeled virtual datasets, generated from noise and independent of any client data.

Three generators (VHL Sec. 5.4, App. C.3), each deterministic given a seed:
- `stylegan2`: an untrained StyleGAN2; class k has a style mean mu_k ~ N(0, 0.5^2 I), latents
  z ~ N(mu_k, 0.3^2 I), and its own noise-input statistics (official code choices).
- `noise`: a per-class mean image at low resolution plus per-sample Gaussian noise, upsampled
  bilinearly into colour blocks.
- `conv`: one randomly initialized small conv generator per class, fed N(0, I) noise.

`generate` returns images class by class (labels 0..num_classes-1, `per_class` each),
standardized per channel over the whole set to match normalized natural data, or (scale
`clamp`, the authors' loader) clamped to [0, 1] and mapped by (x - 0.5) / 0.25.
"""

import inspect
import math
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedhet.methods.vhl.stylegan2 import StyleGAN2Config, StyleGAN2Generator
from fedhet.plugin import InputError

GeneratorKind = Literal["stylegan2", "noise", "conv"]
VirtualScale = Literal["standardize", "clamp"]
CLAMP_MEAN, CLAMP_STD = 0.5, 0.25  # the authors' Normalize of their [0, 1] virtual images
Shape = tuple[int, int, int]


def _derived_seed(seed_sequence: np.random.SeedSequence) -> int:
    return int(seed_sequence.generate_state(1, dtype=np.uint64)[0])


def _torch_generator(seed_sequence: np.random.SeedSequence) -> torch.Generator:
    return torch.Generator().manual_seed(_derived_seed(seed_sequence))


def _in_batches(network: Callable[..., Tensor], inputs: list[Tensor], batch_size: int) -> Tensor:
    """`network(*inputs)` computed on consecutive slices of the inputs' first dimension, so
    activations stay bounded in memory."""
    count = len(inputs[0])
    with torch.no_grad():
        parts = [
            network(*(tensor[i : i + batch_size] for tensor in inputs))
            for i in range(0, count, batch_size)
        ]
    return torch.cat(parts)


def stylegan2_images(
    num_classes: int,
    per_class: int,
    shape: Shape,
    seed: int,
    *,
    style_dim: int = 64,
    mapping_layers: int = 1,
    channels: int = 64,
    noise_strength: float = 0.0,
    class_mean_std: float = 0.5,
    latent_std: float = 0.3,
    batch_size: int = 256,
) -> Tensor:
    """Raw images from one untrained StyleGAN2 shared by all classes.

    Class k's noise maps at layer l are N(m_k[l], (0.1 / L)^2) with m_k a random unit vector
    over the L layers (official code; it additionally optimizes the m_k for diversity, which
    is skipped here). The noise enters scaled by `noise_strength`: 0 by default, as the
    official untrained generator, whose noise-injection weights are initialised to zero; a
    positive value lets the per-class noise act as the paper describes.
    """
    channels_out, height, width = shape
    config = StyleGAN2Config(
        height=height,
        width=width,
        out_channels=channels_out,
        style_dim=style_dim,
        mapping_layers=mapping_layers,
        channels=channels,
        noise_strength=noise_strength,
    )
    weight_seq, stats_seq, *class_seqs = np.random.SeedSequence(seed).spawn(2 + num_classes)
    network = StyleGAN2Generator(config, _derived_seed(weight_seq))
    noise_shapes = network.noise_shapes()
    stats = _torch_generator(stats_seq)
    style_means = class_mean_std * torch.randn(num_classes, style_dim, generator=stats)
    noise_means = F.normalize(torch.randn(num_classes, len(noise_shapes), generator=stats), dim=1)
    noise_std = 0.1 / len(noise_shapes)

    def synthesize(z: Tensor, *noises: Tensor) -> Tensor:
        return network(z, list(noises))

    images = []
    for k, class_seq in enumerate(class_seqs):
        draw = _torch_generator(class_seq)
        z = style_means[k] + latent_std * torch.randn(per_class, style_dim, generator=draw)
        noises = [
            noise_means[k, layer] + noise_std * torch.randn(per_class, 1, h, w, generator=draw)
            for layer, (h, w) in enumerate(noise_shapes)
        ]
        images.append(_in_batches(synthesize, [z, *noises], batch_size))
    return torch.cat(images)


def noise_images(
    num_classes: int,
    per_class: int,
    shape: Shape,
    seed: int,
    *,
    low_resolution: int = 8,
    class_mean_std: float = 1.0,
    sample_std: float = 0.5,
) -> Tensor:
    """Raw images: class mean image ~ N(0, class_mean_std^2) at low resolution, plus
    N(0, sample_std^2) per sample, bilinearly upsampled (official: 8x8, std 1 and 0.5)."""
    channels, height, width = shape
    low_shape = (channels, low_resolution, low_resolution)
    means_seq, *class_seqs = np.random.SeedSequence(seed).spawn(1 + num_classes)
    class_means = class_mean_std * torch.randn(
        num_classes, *low_shape, generator=_torch_generator(means_seq)
    )
    images = []
    for k, class_seq in enumerate(class_seqs):
        noise = torch.randn(per_class, *low_shape, generator=_torch_generator(class_seq))
        images.append(class_means[k] + sample_std * noise)
    return F.interpolate(
        torch.cat(images), size=(height, width), mode="bilinear", align_corners=False
    )


class ConvGenerator(torch.nn.Module):
    """Small untrained decoder: linear to 4x4, a transposed 3x3 conv at 4x4 and one after each
    nearest x2 upsampling, then three 3x3 convs down to the image channels, tanh (VHL App. C.3
    describes four transposed convs and three convs for 32x32). He-normal weights, zero biases."""

    def __init__(self, z_dim: int, channels: int, shape: Shape, generator: torch.Generator):
        super().__init__()
        out_channels, height, width = shape
        self.size = (height, width)
        build_size = max(4, 1 << (max(height, width) - 1).bit_length())
        self.upsamplings = int(math.log2(build_size)) - 2
        self.channels = channels

        def he_normal(*weight_shape: int, fan_in: int) -> torch.nn.Parameter:
            weight = torch.randn(weight_shape, generator=generator) * math.sqrt(2.0 / fan_in)
            return torch.nn.Parameter(weight)

        self.linear = he_normal(channels * 16, z_dim, fan_in=z_dim)
        self.transposed = torch.nn.ParameterList(
            he_normal(channels, channels, 3, 3, fan_in=channels * 9)
            for _ in range(self.upsamplings + 1)
        )
        self.convs = torch.nn.ParameterList(
            [he_normal(channels, channels, 3, 3, fan_in=channels * 9) for _ in range(2)]
            + [he_normal(out_channels, channels, 3, 3, fan_in=channels * 9)]
        )

    def forward(self, z: Tensor) -> Tensor:
        x = F.relu(z @ self.linear.T).view(-1, self.channels, 4, 4)
        for index, weight in enumerate(self.transposed):
            if index > 0:
                x = F.interpolate(x, scale_factor=2, mode="nearest")
            x = F.relu(F.conv_transpose2d(x, weight, padding=1))
        for weight in self.convs[:-1]:
            x = F.relu(F.conv2d(x, weight, padding=1))
        x = torch.tanh(F.conv2d(x, self.convs[-1], padding=1))
        if x.shape[-2:] == self.size:
            return x
        return F.interpolate(
            x, size=self.size, mode="bilinear", align_corners=False, antialias=True
        )


def conv_images(
    num_classes: int,
    per_class: int,
    shape: Shape,
    seed: int,
    *,
    z_dim: int = 64,
    channels: int = 32,
    batch_size: int = 256,
) -> Tensor:
    """Raw images: class k's own randomly initialized ConvGenerator applied to z ~ N(0, I)."""
    images = []
    for class_seq in np.random.SeedSequence(seed).spawn(num_classes):
        weight_seq, latent_seq = class_seq.spawn(2)
        network = ConvGenerator(z_dim, channels, shape, _torch_generator(weight_seq))
        z = torch.randn(per_class, z_dim, generator=_torch_generator(latent_seq))
        images.append(_in_batches(network, [z], batch_size))
    return torch.cat(images)


_SAMPLERS: dict[str, Callable[..., Tensor]] = {
    "stylegan2": stylegan2_images,
    "noise": noise_images,
    "conv": conv_images,
}


def standardize_channels(images: Tensor) -> Tensor:
    """Zero mean, unit std per channel over all images and pixels."""
    mean = images.mean(dim=(0, 2, 3), keepdim=True)
    std = images.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-12)
    return (images - mean) / std


def clamp_scaled(images: Tensor) -> Tensor:
    """Clamped to [0, 1] (as the authors' saved image files), then (x - 0.5) / 0.25."""
    return (images.clamp(0, 1) - CLAMP_MEAN) / CLAMP_STD


def _check_request(
    kind: str, num_classes: int, per_class: int, shape: Shape, options: dict
) -> None:
    if kind not in _SAMPLERS:
        raise InputError(f"virtual generator '{kind}': use one of {', '.join(_SAMPLERS)}")
    if num_classes < 1 or per_class < 1:
        raise InputError(
            f"virtual num_classes={num_classes}, per_class={per_class}: both must be >= 1"
        )
    if len(shape) != 3 or shape[0] < 1 or min(shape[1:]) < 4:
        raise InputError(
            f"virtual shape {tuple(shape)}: use (channels >= 1, height >= 4, width >= 4)"
        )
    allowed = [
        name
        for name, parameter in inspect.signature(_SAMPLERS[kind]).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise InputError(
            f"virtual generator '{kind}' has no option {', '.join(unknown)}: "
            f"use {', '.join(allowed)}"
        )
    if options.get("batch_size", 1) < 1:
        raise InputError(f"virtual batch_size = {options['batch_size']}: use an integer >= 1")


def generate(
    kind: GeneratorKind,
    num_classes: int,
    per_class: int,
    shape: Shape,
    seed: int,
    scale: VirtualScale = "standardize",
    **options: float | int,
) -> tuple[Tensor, Tensor]:
    """Virtual dataset of `num_classes * per_class` images of `shape` (C, H, W), class-major.

    Returns (images N x C x H x W in the given `scale`, int64 labels N). `options` go to
    the kind's generator function (e.g. `channels=32` for stylegan2); unknown ones are an
    InputError. The result depends only on the arguments, not on `batch_size`.
    """
    _check_request(kind, num_classes, per_class, shape, options)
    images = _SAMPLERS[kind](num_classes, per_class, tuple(shape), seed, **options)
    labels = torch.arange(num_classes).repeat_interleave(per_class)
    scaled = standardize_channels(images) if scale == "standardize" else clamp_scaled(images)
    return scaled, labels


def save_grid(images: Tensor, labels: Tensor, path: str | Path, per_class: int = 8) -> None:
    """A labelled grid: one row per class (ascending label), its first `per_class` images."""
    if len(labels) == 0:
        raise InputError("save_grid: no images to draw; pass a non-empty virtual dataset")
    from fedhet.plugin import figure_format, image_grid  # matplotlib only when drawing

    path = Path(path)
    formats = [figure_format(path, "--grid")]
    image_grid(images.numpy(), labels.numpy(), path, per_class, "virtual images", formats)
