"""Scattering transforms (kymatio) of whole image splits, computed once and cached on disk (feature_cache.py).

The transform is fixed (no parameters, nothing learned from data) and maps each image to its own features, so
training on the features has the privacy guarantee of training on the images. It is the slow part of a ScatterNet
run (about 4 ms an image on one CPU core), hence the cache, keyed by the scattering settings and kymatio's version.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial
from importlib.metadata import version
from pathlib import Path

import torch
from torch import Tensor

from dpbench.core.errors import ConfigurationError
from dpbench.models.feature_cache import cached

CHUNK = 1024
"""Images per kymatio call: large enough to amortise its per-call cost, small enough for its FFT buffers."""


@dataclass(frozen=True)
class ScatteringSettings:
    scales: int = 2
    """J: the features are averaged over 2^J pixels; the output is (H / 2^J, W / 2^J)."""
    angles: int = 8
    """L: wavelet orientations."""
    max_order: int = 2

    def channels(self, in_channels: int) -> int:
        """Output channels: 1 + JL (+ L^2 J (J-1) / 2 at order 2) per input channel (81 at J=2, L=8)."""
        second = self.angles**2 * self.scales * (self.scales - 1) // 2 if self.max_order == 2 else 0
        return in_channels * (1 + self.scales * self.angles + second)

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
        channels, height, width = input_shape
        step = 2**self.scales
        if height % step or width % step:
            raise ConfigurationError(
                f"model.scales={self.scales} needs image sides divisible by {step}; the images are {height}x{width}"
            )
        return self.channels(channels), height // step, width // step


def _scattering(settings: ScatteringSettings, size: tuple[int, int]) -> torch.nn.Module:
    # The 2D frontend directly: `kymatio.torch` also imports the 3D one, which needs scipy.special.sph_harm (gone
    # from SciPy 1.17).
    try:
        from kymatio.scattering2d.frontend.torch_frontend import ScatteringTorch2D
    except ImportError as error:
        raise ConfigurationError(f"model=scatternet_linear needs kymatio ({error}): pip install 'kymatio>=0.3,<0.4'") \
            from None
    return ScatteringTorch2D(J=settings.scales, shape=size, L=settings.angles, max_order=settings.max_order)


@torch.no_grad()
def scattering_features(images: Tensor, settings: ScatteringSettings) -> Tensor:
    """(N, C, H, W) images -> (N, C * K, H / 2^J, W / 2^J) float32 features, on the CPU."""
    shape = settings.output_shape(tuple(images.shape[1:]))
    with torch.device("cpu"):  # also under a caller's `with torch.device("cuda")`
        transform = _scattering(settings, tuple(images.shape[2:]))
        chunks = [transform(images[start : start + CHUNK].float().cpu()) for start in range(0, len(images), CHUNK)]
    return torch.cat(chunks).reshape(len(images), *shape)


def cached_features(images: Tensor, settings: ScatteringSettings, cache_dir: Path) -> Tensor:
    """scattering_features(images), from the cache when a file for these exact images and settings is there."""
    stage = repr(("scattering", asdict(settings), version("kymatio")))
    return cached(images, stage, partial(scattering_features, settings=settings),
                  settings.output_shape(tuple(images.shape[1:])), cache_dir, "scattering features")
