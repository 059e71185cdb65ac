"""`model=scatternet_linear`: Tramer & Boneh's (ICLR 2021) ScatterNet + linear model. A fixed scattering transform
(kymatio; computed once per data set, cached on disk) feeds a GroupNorm and one Linear layer, the only parameters
DP-SGD trains: handcrafted features that beat end-to-end CNNs at moderate budgets."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from torch import Tensor, nn

from dpbench.core.errors import ConfigurationError
from dpbench.data import DataBundle
from dpbench.models.feature_cache import default_cache_dir
from dpbench.models.scattering import ScatteringSettings, cached_features


@dataclass
class ScatterNetConfig:
    name: str = "scatternet_linear"
    scales: int = 2
    """Scattering J (2 in the paper: 81 channels of 7x7 on 28x28 grey images)."""
    angles: int = 8
    """Scattering L, the wavelet orientations."""
    max_order: int = 2
    groups: int = 27
    """GroupNorm groups over the scattering channels (27 for Fashion-MNIST in the paper); 0: no normalization."""
    norm_affine: bool = False
    """A trained scale and shift per channel in the GroupNorm (the paper's has none)."""
    cache_dir: str | None = None
    """Where the features are cached; null: $XDG_CACHE_HOME/dpbench/scattering (~/.cache/dpbench/scattering)."""


class ScatterNetLinear(nn.Module):
    """GroupNorm over (C, h, w) scattering features, flatten, Linear: 39,700 parameters on Fashion-MNIST."""

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int, groups: int, norm_affine: bool):
        super().__init__()
        channels = input_shape[0]
        if groups and channels % groups:
            raise ConfigurationError(f"model.groups={groups} must divide the {channels} scattering channels")
        self.norm = nn.GroupNorm(groups, channels, affine=norm_affine) if groups else nn.Identity()
        self.fc = nn.Linear(math.prod(input_shape), num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.norm(x).flatten(1))


def build_scatternet_linear(config: ScatterNetConfig, data: DataBundle) -> nn.Module:
    """The model, after replacing the data's images by their (cached) scattering features."""
    if data.input_shape is None or len(data.input_shape) != 3:
        raise ConfigurationError(f"model=scatternet_linear needs image data (C, H, W); data={data.name} is not")
    if config.max_order not in (1, 2):
        raise ConfigurationError(f"model.max_order must be 1 or 2, got {config.max_order}")
    settings = ScatteringSettings(config.scales, config.angles, config.max_order)
    cache_dir = Path(config.cache_dir).expanduser() if config.cache_dir else default_cache_dir("scattering")
    description = f"scattering (J={settings.scales}, L={settings.angles}, order {settings.max_order})"
    if data.input_transform != description:
        shape = settings.output_shape(data.input_shape)
        data.replace_inputs(partial(cached_features, settings=settings, cache_dir=cache_dir), shape, description)
    return ScatterNetLinear(data.input_shape, data.num_classes, config.groups, config.norm_affine)
