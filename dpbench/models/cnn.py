"""Convolutional image classifiers: the 26K TF-Privacy MNIST CNN and a ~17M-parameter variant for memory tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dpbench.core.errors import ConfigurationError, did_you_mean


@dataclass
class CNNConfig:
    name: str = "cnn"
    activation: str = "tanh"
    """tanh (Papernot et al. 2021: bounded activations suit DP-SGD) or relu."""
    padding: int = 3
    """Zero padding of the first convolution: 3 is TF-Privacy's 'same'; 2 is Tramer & Boneh's (ICLR 2021) CNN for
    MNIST and Fashion-MNIST. The parameter count is the same."""


@dataclass
class LargeCNNConfig:
    name: str = "cnn_large"
    width: int = 256
    hidden: int = 1320
    activation: str = "relu"
    normalization: str | None = None
    """null | groupnorm | batchnorm (refused by every private strategy: it mixes samples)."""


ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


def _activation(name: str) -> nn.Module:
    if name not in ACTIVATIONS:
        raise ConfigurationError(f"model.activation must be one of {sorted(ACTIVATIONS)}, got {name!r}"
                                 f"{did_you_mean(str(name), list(ACTIVATIONS), 'model.activation=')}")
    return ACTIVATIONS[name]()


def _normalization(name: str | None, channels: int) -> list[nn.Module]:
    if name is None:
        return []
    if name == "groupnorm":
        return [nn.GroupNorm(min(32, channels), channels)]
    if name == "batchnorm":
        return [nn.BatchNorm2d(channels)]
    raise ConfigurationError(f"model.normalization must be null, groupnorm or batchnorm, got {name!r}"
                             f"{did_you_mean(str(name), ['groupnorm', 'batchnorm'], 'model.normalization=')}")


class TFPrivacyCNN(nn.Module):
    """conv 16x8x8/2, max-pool 2/1, conv 32x4x4/2, max-pool 2/1, dense 32, dense 10: 26,010 parameters on 28x28."""

    def __init__(
        self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28, activation: str = "tanh",
        padding: int = 3,
    ):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, 8, stride=2, padding=padding),
            _activation(activation),
            nn.MaxPool2d(2, 1),
            nn.Conv2d(16, 32, 4, stride=2),
            _activation(activation),
            nn.MaxPool2d(2, 1),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = self.features(torch.zeros(1, in_channels, image_size, image_size)).shape[1]
        self.classifier = nn.Sequential(nn.Linear(flat, 32), _activation(activation), nn.Linear(32, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


class LargeCNN(nn.Module):
    """Three 3x3 conv blocks and a wide dense head: ~17M parameters at the defaults on 28x28 inputs."""

    def __init__(
        self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28, width: int = 256,
        hidden: int = 1320, activation: str = "relu", normalization: str | None = None,
    ):
        super().__init__()
        channels = [in_channels, width // 4, width // 2, width]
        layers: list[nn.Module] = []
        for block, (c_in, c_out) in enumerate(zip(channels[:-1], channels[1:], strict=True)):
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1), *_normalization(normalization, c_out)]
            layers += [_activation(activation)] + ([nn.MaxPool2d(2)] if block < 2 else [])
        self.features = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            flat = self.features(torch.zeros(1, in_channels, image_size, image_size)).shape[1]
        self.classifier = nn.Sequential(
            nn.Linear(flat, hidden), _activation(activation), nn.Linear(hidden, num_classes)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))
