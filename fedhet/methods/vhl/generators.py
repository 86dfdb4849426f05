"""VHL's labeled virtual datasets, generated from noise and independent of any client data.

Three generators (VHL Sec. 5.4, App. C.3), each deterministic given a seed:
- `stylegan2`: an untrained StyleGAN2; class k has a style mean mu_k ~ N(0, 0.5^2 I), latents
  z ~ N(mu_k, 0.3^2 I), and its own noise-input statistics (official code choices).
- `noise`: a per-class mean image at low resolution plus per-sample Gaussian noise, upsampled
  bilinearly into colour blocks.
- `conv`: one randomly initialized small conv generator per class, fed N(0, I) noise.

Each takes its spec (fedhet.methods.vhl.config: the options and their defaults, declared there
only). `generate` returns images class by class (labels 0..num_classes-1, `per_class` each),
standardized per channel over the whole set to match normalized natural data, or (scale
`clamp`, the authors' loader) clamped to [0, 1] and mapped by (x - 0.5) / 0.25.
"""

import math
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedhet.methods.vhl.config import ConvSpec, GeneratorSpec, NoiseSpec, StyleGAN2Spec
from fedhet.methods.vhl.stylegan2 import StyleGAN2Config, StyleGAN2Generator
from fedhet.plugin import InputError

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
    spec: StyleGAN2Spec, num_classes: int, shape: Shape, seed: int, batch_size: int
) -> Tensor:
    """Raw images from one untrained StyleGAN2 shared by all classes.

    Class k's noise maps at layer l are N(m_k[l], (0.1 / L)^2) with m_k a random unit vector
    over the L layers (official code; it additionally optimizes the m_k for diversity, which
    is skipped here). The noise enters scaled by `spec.noise_strength`: 0 by default, as the
    official untrained generator, whose noise-injection weights are initialised to zero; a
    positive value lets the per-class noise act as the paper describes.
    """
    channels_out, height, width = shape
    config = StyleGAN2Config(
        height=height,
        width=width,
        out_channels=channels_out,
        style_dim=spec.style_dim,
        mapping_layers=spec.mapping_layers,
        channels=spec.channels,
        noise_strength=spec.noise_strength,
    )
    weight_seq, stats_seq, *class_seqs = np.random.SeedSequence(seed).spawn(2 + num_classes)
    network = StyleGAN2Generator(config, _derived_seed(weight_seq))
    noise_shapes = network.noise_shapes()
    stats = _torch_generator(stats_seq)
    style_means = spec.class_mean_std * torch.randn(num_classes, spec.style_dim, generator=stats)
    noise_means = F.normalize(torch.randn(num_classes, len(noise_shapes), generator=stats), dim=1)
    noise_std = 0.1 / len(noise_shapes)

    def synthesize(z: Tensor, *noises: Tensor) -> Tensor:
        return network(z, list(noises))

    images = []
    for k, class_seq in enumerate(class_seqs):
        draw = _torch_generator(class_seq)
        latents = torch.randn(spec.per_class, spec.style_dim, generator=draw)
        z = style_means[k] + spec.latent_std * latents
        noises = [
            noise_means[k, layer] + noise_std * torch.randn(spec.per_class, 1, h, w, generator=draw)
            for layer, (h, w) in enumerate(noise_shapes)
        ]
        images.append(_in_batches(synthesize, [z, *noises], batch_size))
    return torch.cat(images)


def noise_images(spec: NoiseSpec, num_classes: int, shape: Shape, seed: int) -> Tensor:
    """Raw images: class mean image ~ N(0, class_mean_std^2) at low resolution, plus
    N(0, sample_std^2) per sample, bilinearly upsampled (official: 8x8, std 1 and 0.5)."""
    channels, height, width = shape
    low_shape = (channels, spec.low_resolution, spec.low_resolution)
    means_seq, *class_seqs = np.random.SeedSequence(seed).spawn(1 + num_classes)
    class_means = spec.class_mean_std * torch.randn(
        num_classes, *low_shape, generator=_torch_generator(means_seq)
    )
    images = []
    for k, class_seq in enumerate(class_seqs):
        noise = torch.randn(spec.per_class, *low_shape, generator=_torch_generator(class_seq))
        images.append(class_means[k] + spec.sample_std * noise)
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
    spec: ConvSpec, num_classes: int, shape: Shape, seed: int, batch_size: int
) -> Tensor:
    """Raw images: class k's own randomly initialized ConvGenerator applied to z ~ N(0, I)."""
    images = []
    for class_seq in np.random.SeedSequence(seed).spawn(num_classes):
        weight_seq, latent_seq = class_seq.spawn(2)
        network = ConvGenerator(spec.z_dim, spec.channels, shape, _torch_generator(weight_seq))
        z = torch.randn(spec.per_class, spec.z_dim, generator=_torch_generator(latent_seq))
        images.append(_in_batches(network, [z], batch_size))
    return torch.cat(images)


def standardize_channels(images: Tensor) -> Tensor:
    """Zero mean, unit std per channel over all images and pixels."""
    mean = images.mean(dim=(0, 2, 3), keepdim=True)
    std = images.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-12)
    return (images - mean) / std


def clamp_scaled(images: Tensor) -> Tensor:
    """Clamped to [0, 1] (as the authors' saved image files), then (x - 0.5) / 0.25."""
    return (images.clamp(0, 1) - CLAMP_MEAN) / CLAMP_STD


def _check_request(num_classes: int, shape: Shape, batch_size: int) -> None:
    if num_classes < 1:
        raise InputError(f"virtual num_classes={num_classes}: must be >= 1")
    if len(shape) != 3 or shape[0] < 1 or min(shape[1:]) < 4:
        raise InputError(
            f"virtual shape {tuple(shape)}: use (channels >= 1, height >= 4, width >= 4)"
        )
    if batch_size < 1:
        raise InputError(f"virtual batch_size = {batch_size}: use an integer >= 1")


def _raw_images(
    spec: GeneratorSpec, num_classes: int, shape: Shape, seed: int, batch_size: int
) -> Tensor:
    if isinstance(spec, StyleGAN2Spec):
        return stylegan2_images(spec, num_classes, shape, seed, batch_size)
    if isinstance(spec, NoiseSpec):
        return noise_images(spec, num_classes, shape, seed)
    return conv_images(spec, num_classes, shape, seed, batch_size)


def generate(
    spec: GeneratorSpec,
    num_classes: int,
    shape: Shape,
    seed: int,
    scale: VirtualScale = "standardize",
    batch_size: int = 256,
) -> tuple[Tensor, Tensor]:
    """Virtual dataset of `num_classes * spec.per_class` images of `shape` (C, H, W), drawn by
    the generator `spec` describes, class-major.

    Returns (images N x C x H x W in the given `scale`, int64 labels N). The result depends only
    on the arguments, not on `batch_size` (the images a network draws at once).
    """
    _check_request(num_classes, shape, batch_size)
    images = _raw_images(spec, num_classes, tuple(shape), seed, batch_size)
    labels = torch.arange(num_classes).repeat_interleave(spec.per_class)
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
