"""Scattering transforms (kymatio) of whole image splits, computed once and cached on disk.

The transform is fixed (no parameters, nothing learned from data) and maps each image to its own features, so
training on the features has the privacy guarantee of training on the images. It is the slow part of a ScatterNet
run (about 4 ms an image on one CPU core), hence the cache: one file per split, keyed by the split's exact contents
and the scattering settings, so that a changed data set or setting recomputes and nothing stale is ever read.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path

import torch
from torch import Tensor

from dpbench.errors import ConfigurationError

log = logging.getLogger(__name__)
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


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/dpbench/scattering, or ~/.cache/dpbench/scattering."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "dpbench" / "scattering"


def cache_key(images: Tensor, settings: ScatteringSettings) -> str:
    """A digest of the images' bytes, shape and dtype, the settings and kymatio's version (its filters)."""
    digest = hashlib.sha256(repr((asdict(settings), version("kymatio"), tuple(images.shape), str(images.dtype)))
                            .encode())
    digest.update(images.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:32]


def cached_features(images: Tensor, settings: ScatteringSettings, cache_dir: Path) -> Tensor:
    """scattering_features(images), read from cache_dir when a file for these exact images and settings is there,
    else computed and written (atomically, 0600: features of training data are as private as the data)."""
    path = cache_dir / f"{cache_key(images, settings)}.pt"
    expected = (len(images), *settings.output_shape(tuple(images.shape[1:])))
    if path.exists():
        try:
            features = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # torn or foreign file: recompute and replace it
            log.warning("scattering cache %s unreadable (%s): recomputing", path, error)
        else:
            if isinstance(features, Tensor) and tuple(features.shape) == expected:
                log.info("scattering features of %d images read from %s", len(images), path)
                return features
            log.warning("scattering cache %s holds another shape: recomputing", path)
    started = time.perf_counter()
    features = scattering_features(images, settings)
    cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    handle, temporary = tempfile.mkstemp(dir=cache_dir, suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            torch.save(features, file)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    log.info("scattering features of %d images computed in %.0f s, cached in %s", len(images),
             time.perf_counter() - started, path)
    return features
