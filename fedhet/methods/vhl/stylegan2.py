"""An untrained StyleGAN2 generator (Karras et al., 2020) in plain PyTorch, for VHL's virtual data.

VHL never trains it: random weights turn class-dependent latents into structured, separable
images. Parts: a mapping network (pixel norm + equalized linear layers), a learned constant
4x4 input, style-modulated 3x3 convolutions with weight demodulation, per-layer noise
injection, and skip-architecture image outputs summed across resolutions. Everything runs on
CPU with stock torch ops; bilinear resampling stands in for the official FIR (upfirdn2d) filters.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.plugin import InputError

_LRELU_SLOPE = 0.2
_LRELU_GAIN = math.sqrt(2.0)  # keeps a leaky-ReLU layer variance-preserving
_EPS = 1e-8


@dataclass(frozen=True)
class StyleGAN2Config:
    """Architecture of the generator; `channels` is the feature width at every resolution."""

    height: int = 32
    width: int = 32
    out_channels: int = 3
    style_dim: int = 64
    mapping_layers: int = 1
    channels: int = 64
    noise_strength: float = 0.0  # the official noise-injection weights start at zero

    def __post_init__(self) -> None:
        if min(self.height, self.width) < 4:
            raise InputError(f"virtual image size {self.height}x{self.width}: use at least 4x4")
        for name in ("out_channels", "style_dim", "channels"):
            if getattr(self, name) < 1:
                raise InputError(f"stylegan2 {name} = {getattr(self, name)}: use an integer >= 1")
        if self.mapping_layers < 0:
            raise InputError(f"stylegan2 mapping_layers = {self.mapping_layers}: use >= 0")

    @property
    def build_size(self) -> int:
        """The power of two >= the requested size at which the network synthesizes."""
        return max(4, 1 << (max(self.height, self.width) - 1).bit_length())


def _leaky_relu(x: Tensor) -> Tensor:
    return F.leaky_relu(x, _LRELU_SLOPE) * _LRELU_GAIN


def _random_normal(shape: tuple[int, ...], generator: torch.Generator) -> nn.Parameter:
    return nn.Parameter(torch.randn(shape, generator=generator))


class EqualizedLinear(nn.Module):
    """Linear layer with N(0, 1) weights scaled by 1/sqrt(fan_in) at run time."""

    def __init__(self, in_dim: int, out_dim: int, bias_init: float, generator: torch.Generator):
        super().__init__()
        self.weight = _random_normal((out_dim, in_dim), generator)
        self.bias = nn.Parameter(torch.full((out_dim,), bias_init))
        self.scale = 1.0 / math.sqrt(in_dim)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight * self.scale, self.bias)


class MappingNetwork(nn.Module):
    """z -> w: pixel norm, then `layers` equalized linear layers with leaky ReLU."""

    def __init__(self, style_dim: int, layers: int, generator: torch.Generator):
        super().__init__()
        self.layers = nn.ModuleList(
            EqualizedLinear(style_dim, style_dim, 0.0, generator) for _ in range(layers)
        )

    def forward(self, z: Tensor) -> Tensor:
        w = z * torch.rsqrt(z.square().mean(dim=1, keepdim=True) + _EPS)
        for layer in self.layers:
            w = _leaky_relu(layer(w))
        return w


class ModulatedConv2d(nn.Module):
    """Convolution whose input channels are scaled by a per-sample style (modulation); with
    `demodulate`, each output channel's effective weights are rescaled to unit L2 norm so that
    unit-variance inputs give unit-variance outputs."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        style_dim: int,
        demodulate: bool,
        generator: torch.Generator,
    ):
        super().__init__()
        self.weight = _random_normal(
            (out_channels, in_channels, kernel_size, kernel_size), generator
        )
        self.scale = 1.0 / math.sqrt(in_channels * kernel_size**2)
        self.affine = EqualizedLinear(style_dim, in_channels, 1.0, generator)
        self.demodulate = demodulate

    def forward(self, x: Tensor, w: Tensor) -> Tensor:
        # Scaling the input by the style equals scaling the weights per sample, and avoids
        # the per-sample grouped convolution of the fused formulation.
        style = self.affine(w)
        weight = self.weight * self.scale
        out = F.conv2d(x * style[:, :, None, None], weight, padding=weight.shape[-1] // 2)
        if not self.demodulate:
            return out
        weight_energy = weight.square().sum(dim=(2, 3))  # (out, in)
        demod = torch.rsqrt(style.square() @ weight_energy.T + _EPS)  # (batch, out)
        return out * demod[:, :, None, None]


class StyledLayer(nn.Module):
    """[bilinear x2 upsample] -> modulated 3x3 conv -> + noise -> + bias -> leaky ReLU."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        style_dim: int,
        upsample: bool,
        noise_strength: float,
        generator: torch.Generator,
    ):
        super().__init__()
        self.upsample = upsample
        self.conv = ModulatedConv2d(in_channels, out_channels, 3, style_dim, True, generator)
        self.noise_strength = noise_strength
        self.bias = nn.Parameter(torch.zeros(1, out_channels, 1, 1))

    def forward(self, x: Tensor, w: Tensor, noise: Tensor) -> Tensor:
        if self.upsample:
            x = _upsample(x)
        out = self.conv(x, w) + self.noise_strength * noise
        return _leaky_relu(out + self.bias)


class ToImage(nn.Module):
    """The skip architecture's per-resolution output: modulated 1x1 conv without demodulation."""

    def __init__(
        self, in_channels: int, out_channels: int, style_dim: int, generator: torch.Generator
    ):
        super().__init__()
        self.conv = ModulatedConv2d(in_channels, out_channels, 1, style_dim, False, generator)
        self.bias = nn.Parameter(torch.zeros(1, out_channels, 1, 1))

    def forward(self, x: Tensor, w: Tensor) -> Tensor:
        return self.conv(x, w) + self.bias


def _upsample(x: Tensor) -> Tensor:
    return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)


class StyleGAN2Generator(nn.Module):
    """Untrained StyleGAN2 generator with random weights drawn from `seed`.

    `forward(z, noises)` is a pure function of its inputs: the caller draws the latents and
    one noise map per layer (shapes from `noise_shapes`), which is how VHL makes both
    class-dependent.
    """

    def __init__(self, config: StyleGAN2Config, seed: int):
        super().__init__()
        self.config = config
        generator = torch.Generator().manual_seed(seed)
        ch, style_dim = config.channels, config.style_dim
        self.mapping = MappingNetwork(style_dim, config.mapping_layers, generator)
        self.constant = _random_normal((1, ch, 4, 4), generator)
        self.first_layer = StyledLayer(ch, ch, style_dim, False, config.noise_strength, generator)
        self.first_output = ToImage(ch, config.out_channels, style_dim, generator)
        self.blocks = nn.ModuleList()
        for _ in range(int(math.log2(config.build_size)) - 2):
            self.blocks.append(
                nn.ModuleList(
                    [
                        StyledLayer(ch, ch, style_dim, True, config.noise_strength, generator),
                        StyledLayer(ch, ch, style_dim, False, config.noise_strength, generator),
                        ToImage(ch, config.out_channels, style_dim, generator),
                    ]
                )
            )

    def noise_shapes(self) -> list[tuple[int, int]]:
        """(height, width) of the noise map each styled layer takes, in forward order."""
        sizes = [4] + [4 << (i // 2 + 1) for i in range(2 * len(self.blocks))]
        return [(size, size) for size in sizes]

    def forward(self, z: Tensor, noises: list[Tensor]) -> Tensor:
        """z: (B, style_dim) latents; noises: one (B, 1, h, w) map per layer -> (B, C, H, W)."""
        if len(noises) != len(self.noise_shapes()):
            raise ValueError(f"expected {len(self.noise_shapes())} noise maps, got {len(noises)}")
        w = self.mapping(z)
        x = self.constant.expand(z.shape[0], -1, -1, -1)
        x = self.first_layer(x, w, noises[0])
        image = self.first_output(x, w)
        for index, (up_layer, layer, to_image) in enumerate(self.blocks):
            x = up_layer(x, w, noises[1 + 2 * index])
            x = layer(x, w, noises[2 + 2 * index])
            image = _upsample(image) + to_image(x, w)
        return self._fit_to_size(image)

    def _fit_to_size(self, image: Tensor) -> Tensor:
        size = (self.config.height, self.config.width)
        if image.shape[-2:] == size:
            return image
        return F.interpolate(image, size=size, mode="bilinear", align_corners=False, antialias=True)
