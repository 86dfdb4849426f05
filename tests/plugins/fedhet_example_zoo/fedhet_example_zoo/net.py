"""The `twolayer` network, built by fedhet (seeded) from its spec block."""

import math

from torch import nn

from fedhet_example_zoo.plugin import TwoLayerConfig


def build(config: TwoLayerConfig, in_shape: tuple[int, int, int], num_classes: int):
    features = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(in_shape), config.width), nn.Tanh())
    return features, nn.Linear(config.width, num_classes)
