"""The 4-layer CNN of Jiang et al.'s D2P2-SGD experiments (Appendix A.9.3, Table 5), so that D2P2's claim is
measured on the model it was made on, not only on the 26K TF-Privacy CNN.

Table 5 lists four 3x3 stride-1 convolutions of 16, 32, 32 and 64 filters, 2x2 average pooling after the first three,
adaptive average pooling to 1x1 after the fourth, and a fully connected layer from those 64 features to the 10-way
softmax. It is Opacus's CIFAR-10 example `convnet` at half width, which the authors' code builds on; the table is
silent on padding and activation, so both are that network's: padding 1 and ReLU. 33,194 parameters on 28x28 grey
images; no normalisation layer, so every privatizer takes it as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from dpbench.core.errors import ConfigurationError
from dpbench.data import DataBundle
from dpbench.models.cnn import _activation

WIDTHS = (16, 32, 32, 64)


@dataclass
class D2P2CNNConfig:
    name: str = "cnn_d2p2"
    activation: str = "relu"
    """relu (Opacus's convnet, which Table 5 halves) or tanh; the paper does not say."""
    padding: int = 1
    """Zero padding of every 3x3 convolution: 1 keeps the size (Opacus's convnet); the paper does not say."""


class D2P2PaperCNN(nn.Module):
    """conv 16 / avg-pool 2 / conv 32 / avg-pool 2 / conv 32 / avg-pool 2 / conv 64 / global avg-pool / dense 10."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, activation: str = "relu", padding: int = 1):
        super().__init__()
        layers: list[nn.Module] = []
        for block, (c_in, c_out) in enumerate(zip((in_channels, *WIDTHS[:-1]), WIDTHS, strict=True)):
            layers += [nn.Conv2d(c_in, c_out, 3, stride=1, padding=padding), _activation(activation)]
            layers.append(nn.AvgPool2d(2) if block < len(WIDTHS) - 1 else nn.AdaptiveAvgPool2d(1))
        self.features = nn.Sequential(*layers, nn.Flatten())
        self.classifier = nn.Linear(WIDTHS[-1], num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


def _smallest_map(size: int, padding: int) -> int:
    """The smallest feature map side the layers produce from `size` pixels (below 1: the input is too small)."""
    smallest = size
    for block in range(len(WIDTHS)):
        size += 2 * padding - 2
        smallest = min(smallest, size)
        if block < len(WIDTHS) - 1:
            size //= 2
            smallest = min(smallest, size)
    return smallest


def build_cnn_d2p2(config: D2P2CNNConfig, data: DataBundle) -> nn.Module:
    if data.input_shape is None or len(data.input_shape) != 3:
        raise ConfigurationError(f"model=cnn_d2p2 needs image data (C, H, W); data={data.name} is not")
    channels, height, width = data.input_shape
    if _smallest_map(min(height, width), config.padding) < 1:
        raise ConfigurationError(f"model=cnn_d2p2 pools three times: data={data.name}'s {height}x{width} images are "
                                 f"too small at model.padding={config.padding}; use larger images or more padding")
    return D2P2PaperCNN(channels, data.num_classes, config.activation, config.padding)
