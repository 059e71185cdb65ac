"""A model from outside dpbench: a builder whose first parameter's dataclass is its config schema."""

import math
from dataclasses import dataclass

from torch import nn

from dpbench import DataBundle


@dataclass
class MLPConfig:
    name: str = "mlp"
    hidden: int = 64


def build_mlp(config: MLPConfig, data: DataBundle) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(math.prod(data.input_shape), config.hidden),
        nn.Tanh(),
        nn.Linear(config.hidden, data.num_classes),
    )
