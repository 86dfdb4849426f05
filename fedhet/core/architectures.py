"""One torch-free description of every model architecture: its stages and their layers' shapes.

`fedhet.models` builds the torch modules from it, layer by layer in the order listed here (the
order that seeded initialization follows); the spec counts parameters and names split points
from it without building anything, and the memory check takes its advice for shrinking a
model from it. Every model is named stages of a feature extractor followed by a linear head.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol

NormKind = Literal["batch", "group", "none"]

# BasicBlocks per stage of each ResNet
RESNET_BLOCKS = {"resnet18": (2, 2, 2, 2), "resnet20": (3, 3, 3)}


class ModelFields(Protocol):
    """The fields of `fedhet.core.spec.ModelSpec` an architecture is described from."""

    arch: str
    norm: NormKind
    hidden: Sequence[int]
    channels: Sequence[int]
    fc_width: int
    width: int
    groups: int


# --- layers -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Linear:
    n_in: int
    n_out: int

    @property
    def parameters(self) -> int:
        return self.n_in * self.n_out + self.n_out


@dataclass(frozen=True)
class Conv:
    c_in: int
    c_out: int
    kernel: int
    stride: int = 1
    padding: int = 0
    bias: bool = True

    @property
    def parameters(self) -> int:
        return self.c_in * self.c_out * self.kernel**2 + (self.c_out if self.bias else 0)


@dataclass(frozen=True)
class Norm:
    kind: NormKind
    channels: int
    groups: int
    dims: int  # 1 (vectors) or 2 (images)

    @property
    def parameters(self) -> int:
        return 0 if self.kind == "none" else 2 * self.channels  # affine scale and shift


class Parameterless:
    """A layer that holds no parameters."""

    parameters: ClassVar[int] = 0


@dataclass(frozen=True)
class ReLU(Parameterless):
    """max(0, x), elementwise."""


@dataclass(frozen=True)
class MaxPool(Parameterless):
    size: int


@dataclass(frozen=True)
class GlobalAvgPool(Parameterless):
    """The mean of each channel over its positions."""


@dataclass(frozen=True)
class Flatten(Parameterless):
    """Each sample's features as one vector."""


@dataclass(frozen=True)
class ResidualBlock:
    """Two 3x3 convolutions with a residual connection (1x1 conv shortcut when shapes change)."""

    conv1: Conv
    norm1: Norm
    conv2: Conv
    norm2: Norm
    shortcut: tuple[Conv, Norm] | None

    @property
    def parameters(self) -> int:
        layers = [self.conv1, self.norm1, self.conv2, self.norm2, *(self.shortcut or ())]
        return sum(layer.parameters for layer in layers)


Layer = Linear | Conv | Norm | ReLU | MaxPool | GlobalAvgPool | Flatten | ResidualBlock


@dataclass(frozen=True)
class Stage:
    """A named stage of the feature extractor; the model can be split after any stage."""

    name: str
    layers: tuple[Layer, ...]


@dataclass(frozen=True)
class Architecture:
    stages: tuple[Stage, ...]  # the last one ends in the flat penultimate features
    head: Linear
    widths: tuple[int, ...]  # the widths its norm layers act on, named by `widths_field`
    widths_field: str
    shrink: str  # how to make the model smaller, when it does not fit in memory
    min_size: int = 1  # the least input height and width it takes

    @property
    def parameter_count(self) -> int:
        layers = [layer for stage in self.stages for layer in stage.layers]
        return sum(layer.parameters for layer in layers) + self.head.parameters

    @property
    def split_points(self) -> list[str]:
        return [stage.name for stage in self.stages]


# --- architectures ----------------------------------------------------------------------


def _mlp(model: ModelFields, in_shape: tuple[int, int, int], num_classes: int) -> Architecture:
    in_dim = in_shape[0] * in_shape[1] * in_shape[2]
    stages = [Stage("flatten", (Flatten(),))] if not model.hidden else []  # logistic regression
    width = in_dim
    for i, out in enumerate(model.hidden, start=1):
        flatten = (Flatten(),) if i == 1 else ()
        norm = Norm(model.norm, out, model.groups, dims=1)
        stages.append(Stage(f"hidden{i}", (*flatten, Linear(width, out), norm, ReLU())))
        width = out
    return Architecture(
        tuple(stages),
        Linear(width, num_classes),
        widths=tuple(model.hidden),
        widths_field="model.hidden",
        shrink="narrow model.hidden",
    )


def _simple_cnn(
    model: ModelFields, in_shape: tuple[int, int, int], num_classes: int
) -> Architecture:
    """Two 5x5 'same' convolutions with 2x2 max-pooling, then two fully connected layers.

    padding=2 keeps each conv's spatial size, so 8x8, 28x28 and 32x32 inputs all work.
    """
    c_in, height, width = in_shape
    c1, c2 = model.channels

    def conv_stage(name: str, cin: int, cout: int) -> Stage:
        norm = Norm(model.norm, cout, model.groups, dims=2)
        return Stage(name, (Conv(cin, cout, 5, padding=2), norm, ReLU(), MaxPool(2)))

    flat = c2 * (height // 4) * (width // 4)
    stages = (
        conv_stage("conv1", c_in, c1),
        conv_stage("conv2", c1, c2),
        Stage("fc1", (Flatten(), Linear(flat, model.fc_width), ReLU())),
    )
    return Architecture(
        stages,
        Linear(model.fc_width, num_classes),
        widths=(c1, c2),
        widths_field="model.channels",
        shrink="narrow model.channels or model.fc_width",
        min_size=4,  # two 2x2 max-pools
    )


def _fedbr_cnn(
    model: ModelFields, in_shape: tuple[int, int, int], num_classes: int
) -> Architecture:
    """FedBR's RotatedMNIST CNN (DomainBed's MNIST_CNN): four 3x3 convolutions of widths
    (w, 2w, 2w, 2w), the second with stride 2, each followed by ReLU and then the norm layer;
    global average pooling gives 2w features (the official code: w=64, GroupNorm(8))."""
    w = model.width
    widths = (w, 2 * w, 2 * w, 2 * w)

    def conv_stage(name: str, cin: int, cout: int, stride: int) -> Stage:
        norm = Norm(model.norm, cout, model.groups, dims=2)
        return Stage(name, (Conv(cin, cout, 3, stride=stride, padding=1), ReLU(), norm))

    c_in = in_shape[0]
    stages = []
    for i, (width, stride) in enumerate(zip(widths, (1, 2, 1, 1), strict=True), start=1):
        stages.append(conv_stage(f"conv{i}", c_in, width, stride))
        c_in = width
    return _pooled(
        stages, c_in, num_classes, widths, "fedbr_cnn conv (model.width, then 2 * model.width)"
    )


def _resnet(model: ModelFields, in_shape: tuple[int, int, int], num_classes: int) -> Architecture:
    """CIFAR-style ResNet: 3x3 stride-1 stem, no max-pool, stages doubling the width."""
    blocks = RESNET_BLOCKS[model.arch]
    widths = tuple(model.width * 2**i for i in range(len(blocks)))
    bias = model.norm == "none"  # a following norm layer makes a conv bias redundant

    def norm(channels: int) -> Norm:
        return Norm(model.norm, channels, model.groups, dims=2)

    def block(c_in: int, c_out: int, stride: int) -> ResidualBlock:
        conv1 = Conv(c_in, c_out, 3, stride=stride, padding=1, bias=bias)
        conv2 = Conv(c_out, c_out, 3, stride=1, padding=1, bias=bias)
        shortcut = None
        if stride != 1 or c_in != c_out:
            shortcut = (Conv(c_in, c_out, 1, stride=stride, bias=bias), norm(c_out))
        return ResidualBlock(conv1, norm(c_out), conv2, norm(c_out), shortcut)

    stem = Conv(in_shape[0], widths[0], 3, stride=1, padding=1, bias=bias)
    stages = [Stage("stem", (stem, norm(widths[0]), ReLU()))]
    c_in = widths[0]
    for i, (width, count) in enumerate(zip(widths, blocks, strict=True), start=1):
        stride = 1 if i == 1 else 2  # every layer after the first halves the spatial size
        layer = []
        for _ in range(count):
            layer.append(block(c_in, width, stride))
            c_in, stride = width, 1
        stages.append(Stage(f"layer{i}", tuple(layer)))
    return _pooled(stages, c_in, num_classes, widths, "resnet stage (model.width * 2**stage)")


def _pooled(
    stages: list[Stage], c_in: int, num_classes: int, widths: tuple[int, ...], widths_field: str
) -> Architecture:
    """A convolutional net on `model.width`: its `stages` (of `c_in` output channels), then a
    global average pool and the linear head."""
    pool = Stage("pool", (GlobalAvgPool(), Flatten()))
    return Architecture(
        (*stages, pool),
        Linear(c_in, num_classes),
        widths=widths,
        widths_field=widths_field,
        shrink="lower model.width",
    )


ARCHITECTURES: dict[str, Callable[[ModelFields, tuple[int, int, int], int], Architecture]] = {
    "mlp": _mlp,
    "simple_cnn": _simple_cnn,
    "fedbr_cnn": _fedbr_cnn,
    "resnet18": _resnet,
    "resnet20": _resnet,
}

# Stage names depend on the model's fields alone; any input shape and class count gives them.
_ANY_INPUT = ((1, 32, 32), 1)


def describe(model: ModelFields, in_shape: tuple[int, int, int], num_classes: int) -> Architecture:
    """The architecture `model` describes for (channels, height, width) inputs."""
    return ARCHITECTURES[model.arch](model, in_shape, num_classes)


def norm_kinds(model: ModelFields) -> set[NormKind]:
    """The kinds of the model's normalization layers (none when it has no such layer); a
    plug-in's model (fedhet.core.model_config) says its own, `norm`."""
    if model.arch not in ARCHITECTURES:
        return {model.norm}
    layers = [layer for stage in describe(model, *_ANY_INPUT).stages for layer in stage.layers]
    blocks = [block for block in layers if isinstance(block, ResidualBlock)]
    inner = [n for b in blocks for n in (b.norm1, b.norm2, *(b.shortcut or ()))]
    return {layer.kind for layer in [*layers, *inner] if isinstance(layer, Norm)}


def group_norm_problem(model: ModelFields) -> str | None:
    """Why `model.groups` cannot split its GroupNorm layers' widths, or None."""
    if model.norm != "group":
        return None
    described = describe(model, *_ANY_INPUT)
    widths = list(described.widths)
    bad = [w for w in widths if w % model.groups]
    if not bad:
        return None
    return (
        f"does not divide {described.widths_field} width(s) {bad}; choose groups that divides "
        f"every width of {widths}"
    )


def split_points(model: ModelFields) -> list[str]:
    """The names of the stages after which the model can be split, in forward order."""
    return describe(model, *_ANY_INPUT).split_points


def parameter_layers(model: ModelFields) -> list[str]:
    """The model's layers that hold parameters, in forward order, each named by the prefix of
    its state-dict entries: every feature stage with parameters (`features.<stage>`), then
    `head`. A plug-in's model (fedhet.core.model_config) is two layers, `features` and `head`.
    What personalized methods count their personal layers in (from the output: `head` is 1)."""
    if model.arch not in ARCHITECTURES:
        return ["features", "head"]
    stages = describe(model, *_ANY_INPUT).stages
    held = [s.name for s in stages if any(layer.parameters for layer in s.layers)]
    return [*(f"features.{name}" for name in held), "head"]


def layer_split_problem(model: ModelFields, count: int) -> str | None:
    """Why the last `count` of the model's `parameter_layers` cannot be split from the layers
    below them (at least one must stay below), or None."""
    layers = parameter_layers(model)
    if count < len(layers):
        return None
    if len(layers) == 1:
        return (
            "leaves no other layer: the model's only layer with parameters is its head; "
            "give it hidden layers"
        )
    return (
        f"leaves no other layer of the model's {len(layers)} ({', '.join(layers)}); "
        f"choose at most {len(layers) - 1}"
    )
