"""The model zoo: every fedhet model is a feature extractor followed by a linear head.

The feature extractor is an `nn.Sequential` of named stages (e.g. `conv1`, `conv2`, `fc1`),
so splitting a model after a stage is slicing: the low part is the stages up to and
including it, the high part is the remaining stages plus the head. The last stage always
ends in the flat penultimate features, so every stage name is a valid split point.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Literal

import torch
from torch import nn

from fedhet.core.errors import InputError
from fedhet.core.spec import RESNET_BLOCKS, ModelSpec

Norm = Literal["batch", "group", "none"]


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


# --- normalization ----------------------------------------------------------------------


def _norm(kind: Norm, channels: int, groups: int, dims: int) -> nn.Module:
    """The normalization layer for `channels` features; `dims` is 1 (vectors) or 2 (images)."""
    if kind == "batch":
        return nn.BatchNorm1d(channels) if dims == 1 else nn.BatchNorm2d(channels)
    if kind == "group":
        return nn.GroupNorm(groups, channels)
    return nn.Identity()


def _check_groups(spec: ModelSpec, widths: list[int], field: str) -> None:
    if spec.norm != "group":
        return
    bad = [w for w in widths if w % spec.groups]
    if bad:
        raise InputError(
            f"model.groups={spec.groups} does not divide {field} width(s) {bad}; "
            f"choose groups that divides every width of {widths}"
        )


def _block(*layers: nn.Module) -> nn.Sequential:
    """A stage, leaving out Identity layers (norm=none) so no-op modules never appear."""
    return nn.Sequential(*(layer for layer in layers if not isinstance(layer, nn.Identity)))


# --- mlp --------------------------------------------------------------------------------


def _mlp(spec: ModelSpec, in_shape: tuple[int, int, int], num_classes: int) -> FedModel:
    _check_groups(spec, spec.hidden, "model.hidden")
    in_dim = in_shape[0] * in_shape[1] * in_shape[2]
    if not spec.hidden:  # multinomial logistic regression
        return FedModel(
            nn.Sequential(OrderedDict(flatten=nn.Flatten())), nn.Linear(in_dim, num_classes)
        )
    stages: OrderedDict[str, nn.Module] = OrderedDict()
    width = in_dim
    for i, out in enumerate(spec.hidden, start=1):
        flatten = [nn.Flatten()] if i == 1 else []
        norm = _norm(spec.norm, out, spec.groups, dims=1)
        stages[f"hidden{i}"] = _block(*flatten, nn.Linear(width, out), norm, nn.ReLU())
        width = out
    return FedModel(nn.Sequential(stages), nn.Linear(width, num_classes))


# --- simple_cnn -------------------------------------------------------------------------


def _simple_cnn(spec: ModelSpec, in_shape: tuple[int, int, int], num_classes: int) -> FedModel:
    """Two 5x5 'same' convolutions with 2x2 max-pooling, then two fully connected layers.

    padding=2 keeps each conv's spatial size, so 8x8, 28x28 and 32x32 inputs all work.
    """
    _check_groups(spec, spec.channels, "model.channels")
    c_in, height, width = in_shape
    if height < 4 or width < 4:
        raise InputError(f"simple_cnn needs inputs of at least 4x4 pixels, got {height}x{width}")
    c1, c2 = spec.channels

    def conv_stage(cin: int, cout: int) -> nn.Sequential:
        norm = _norm(spec.norm, cout, spec.groups, dims=2)
        return _block(nn.Conv2d(cin, cout, 5, padding=2), norm, nn.ReLU(), nn.MaxPool2d(2))

    flat = c2 * (height // 4) * (width // 4)
    stages = OrderedDict(
        conv1=conv_stage(c_in, c1),
        conv2=conv_stage(c1, c2),
        fc1=nn.Sequential(nn.Flatten(), nn.Linear(flat, spec.fc_width), nn.ReLU()),
    )
    return FedModel(nn.Sequential(stages), nn.Linear(spec.fc_width, num_classes))


# --- resnet -----------------------------------------------------------------------------


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (1x1 conv shortcut when shapes change)."""

    def __init__(self, c_in: int, c_out: int, stride: int, norm: Norm, groups: int) -> None:
        super().__init__()
        bias = norm == "none"  # a following norm layer makes a conv bias redundant
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=bias)
        self.norm1 = _norm(norm, c_out, groups, dims=2)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, stride=1, padding=1, bias=bias)
        self.norm2 = _norm(norm, c_out, groups, dims=2)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            conv = nn.Conv2d(c_in, c_out, 1, stride=stride, bias=bias)
            self.shortcut = _block(conv, _norm(norm, c_out, groups, dims=2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


def _resnet(
    spec: ModelSpec, in_shape: tuple[int, int, int], num_classes: int, blocks: list[int]
) -> FedModel:
    """CIFAR-style ResNet: 3x3 stride-1 stem, no max-pool, stages doubling the width."""
    widths = [spec.width * 2**i for i in range(len(blocks))]
    _check_groups(spec, widths, "resnet stage (model.width * 2**stage)")
    bias = spec.norm == "none"
    stem_conv = nn.Conv2d(in_shape[0], widths[0], 3, stride=1, padding=1, bias=bias)
    stages: OrderedDict[str, nn.Module] = OrderedDict(
        stem=_block(stem_conv, _norm(spec.norm, widths[0], spec.groups, dims=2), nn.ReLU())
    )
    c_in = widths[0]
    for i, (width, count) in enumerate(zip(widths, blocks, strict=True), start=1):
        stride = 1 if i == 1 else 2  # every layer after the first halves the spatial size
        layer = []
        for _ in range(count):
            layer.append(BasicBlock(c_in, width, stride, spec.norm, spec.groups))
            c_in, stride = width, 1
        stages[f"layer{i}"] = nn.Sequential(*layer)
    stages["pool"] = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
    return FedModel(nn.Sequential(stages), nn.Linear(c_in, num_classes))


# --- public API -------------------------------------------------------------------------


def build_model(
    spec: ModelSpec, in_shape: tuple[int, int, int], num_classes: int, seed: int
) -> FedModel:
    """The model `spec` describes for (channels, height, width) inputs, initialized from `seed`.

    The global torch RNG is forked around construction, so it is left exactly as it was.
    """
    if len(in_shape) != 3 or min(in_shape) < 1:
        raise InputError(f"model input shape must be (channels, height, width), got {in_shape}")
    if num_classes < 1:
        raise InputError(f"model needs at least 1 output class, got num_classes={num_classes}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if spec.arch == "mlp":
            return _mlp(spec, in_shape, num_classes)
        if spec.arch == "simple_cnn":
            return _simple_cnn(spec, in_shape, num_classes)
        return _resnet(spec, in_shape, num_classes, RESNET_BLOCKS[spec.arch])


def num_parameters(model: nn.Module) -> int:
    """Number of parameters (trainable or not; buffers such as BN running stats excluded)."""
    return sum(p.numel() for p in model.parameters())
