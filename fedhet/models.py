"""The model zoo: every fedhet model is a feature extractor followed by a linear head.

The feature extractor is an `nn.Sequential` of named stages (e.g. `conv1`, `conv2`, `fc1`),
so splitting a model after a stage is slicing: the low part is the stages up to and
including it, the high part is the remaining stages plus the head. The last stage always
ends in the flat penultimate features, so every stage name is a valid split point.
"""

from __future__ import annotations

from collections import OrderedDict
from importlib import import_module

import torch
from torch import nn

from fedhet.core import architectures as arch
from fedhet.core.errors import InputError, RunError
from fedhet.core.model_config import ModelConfig
from fedhet.core.spec import ModelSpec


class FedModel(nn.Module):
    """Every fedhet model: a feature extractor followed by a classifier head."""

    def __init__(self, features: nn.Sequential, head: nn.Linear) -> None:
        super().__init__()
        self.features = features
        self.head = head
        self.feature_dim = head.in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    def split_points(self) -> list[str]:
        """Names of the stages after which the model can be split, in forward order."""
        return [name for name, _ in self.features.named_children()]

    def split(self, point: str) -> tuple[nn.Sequential, nn.Sequential]:
        """(low, high) with high(low(x)) == self(x); both share this model's parameters."""
        points = self.split_points()
        if point not in points:
            raise InputError(f"unknown split point {point!r}; choose one of {points}")
        cut = points.index(point) + 1
        low = self.features[:cut]
        high = nn.Sequential(
            OrderedDict([*self.features[cut:].named_children(), ("head", self.head)])
        )
        return low, high


# --- layers -----------------------------------------------------------------------------


def _norm(norm: arch.Norm) -> nn.Module:
    if norm.kind == "batch":
        return nn.BatchNorm1d(norm.channels) if norm.dims == 1 else nn.BatchNorm2d(norm.channels)
    if norm.kind == "group":
        return nn.GroupNorm(norm.groups, norm.channels)
    return nn.Identity()


def _linear(linear: arch.Linear) -> nn.Linear:
    return nn.Linear(linear.n_in, linear.n_out)


def _conv(conv: arch.Conv) -> nn.Conv2d:
    return nn.Conv2d(
        conv.c_in,
        conv.c_out,
        conv.kernel,
        stride=conv.stride,
        padding=conv.padding,
        bias=conv.bias,
    )


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (1x1 conv shortcut when shapes change)."""

    def __init__(self, block: arch.ResidualBlock) -> None:
        super().__init__()
        self.conv1 = _conv(block.conv1)
        self.norm1 = _norm(block.norm1)
        self.conv2 = _conv(block.conv2)
        self.norm2 = _norm(block.norm2)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if block.shortcut is not None:
            self.shortcut = _stage(block.shortcut)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


def _module(layer: arch.Layer) -> nn.Module:
    """The torch module of one described layer, initialized from the global torch RNG."""
    match layer:
        case arch.Linear():
            return _linear(layer)
        case arch.Conv():
            return _conv(layer)
        case arch.Norm():
            return _norm(layer)
        case arch.ReLU():
            return nn.ReLU()
        case arch.MaxPool(size):
            return nn.MaxPool2d(size)
        case arch.GlobalAvgPool():
            return nn.AdaptiveAvgPool2d(1)
        case arch.Flatten():
            return nn.Flatten()
        case arch.ResidualBlock():
            return BasicBlock(layer)
    raise TypeError(f"no torch module for {layer!r}")


def _stage(layers: tuple[arch.Layer, ...]) -> nn.Sequential:
    """The layers in order, leaving out Identity layers (norm=none) so no-op modules never
    appear."""
    modules = [_module(layer) for layer in layers]
    return nn.Sequential(*(m for m in modules if not isinstance(m, nn.Identity)))


def _check_input(spec: ModelSpec, described: arch.Architecture, shape: tuple[int, ...]) -> None:
    height, width, least = *shape[1:], described.min_size
    if height < least or width < least:
        raise InputError(
            f"{spec.arch} needs inputs of at least {least}x{least} pixels, got {height}x{width}"
        )


# --- public API -------------------------------------------------------------------------


def build_model(
    spec: ModelConfig, in_shape: tuple[int, int, int], num_classes: int, seed: int
) -> FedModel:
    """The model `spec` describes for (channels, height, width) inputs, initialized from `seed`
    (a plug-in's by its builder, fedhet.core.model_config).

    The global torch RNG is forked around construction, so it is left exactly as it was.
    """
    if len(in_shape) != 3 or min(in_shape) < 1:
        raise InputError(f"model input shape must be (channels, height, width), got {in_shape}")
    if num_classes < 1:
        raise InputError(f"model needs at least 1 output class, got num_classes={num_classes}")
    if spec.builder is not None:
        return _plugin_model(spec, in_shape, num_classes, seed)
    described = arch.describe(spec, in_shape, num_classes)
    _check_input(spec, described, in_shape)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        stages = OrderedDict((stage.name, _stage(stage.layers)) for stage in described.stages)
        features = nn.Sequential(stages)  # built before the head: the seeded order of init
        return FedModel(features, _linear(described.head))


def _plugin_model(
    spec: ModelConfig, in_shape: tuple[int, int, int], num_classes: int, seed: int
) -> FedModel:
    module, _, function = spec.builder.partition(":")
    try:
        build = getattr(import_module(module), function)
    except Exception as err:  # a plug-in's code failing to import is the plug-in's failure
        raise RunError(f"model.arch {spec.arch}: cannot import {spec.builder}: {err}") from err
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        features, head = build(spec, in_shape, num_classes)
    if not (isinstance(features, nn.Module) and isinstance(head, nn.Linear)):
        raise RunError(
            f"model.arch {spec.arch}: {spec.builder} must return (features, head), an "
            "nn.Module and an nn.Linear"
        )
    return FedModel(nn.Sequential(OrderedDict(features=features)), head)


def num_parameters(model: nn.Module) -> int:
    """Number of parameters (trainable or not; buffers such as BN running stats excluded)."""
    return sum(p.numel() for p in model.parameters())
