"""D2P2-SGD (Jiang et al., Algorithm 1) and its variants D2P-SGD (Algorithm 2) and DP2-SGD (Algorithm 3).

A step: per-sample automatic clipping C g / (||g|| + gamma) (every contribution has norm below C), the sum
projected to p dimensions with the step's Gaussian matrix, y = A^T s / sqrt(p) + N(0, (sigma_k C)^2 I_p), mapped
back as A y / sqrt(p) and divided by the expected batch size; sigma_k follows `noise_decay` (sigma / sqrt(k) by
default). The back-projection's 1/sqrt(p) makes the update unbiased: the paper's A y is this update times sqrt(p),
i.e. the same algorithm with the learning rate multiplied by sqrt(p). By default (`projection: auto`) the update
A y / sqrt(p) is drawn from its exact law without forming A, in O(d + p) (implicit_projection.py); the explicit path
regenerates A from seeds in O(d p) (gaussian_projection.py), as clip_after_projection's per-sample projections need.

Accounting that holds for this code (see docs/d2p2-accounting.md): projecting *before* the noise makes the
sensitivity in the projected space random, ||A^T c|| / sqrt(p) = ||c|| sqrt(chi2_p / p) <= C sqrt(chi2_p / p), so a
step is the Poisson-subsampled Gaussian mixture over that chi-square law (SubsampledGaussianMixture, df = p,
exponent -1). With clip_after_projection the projected per-sample gradients are clipped instead, the sensitivity
is C, and a step is the plain subsampled Gaussian. The schedule is composed in buckets (dpbench.privacy.noise_schedule).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from dpbench.core.errors import ConfigurationError
from dpbench.core.tasks import Batch, Task, batch_size_of
from dpbench.privacy.mechanisms import Composition, Mechanism, SubsampledGaussian
from dpbench.privacy.mixture import SubsampledGaussianMixture
from dpbench.privacy.noise_schedule import NoiseSchedule
from dpbench.privatizers.base import PrivacySettings, PrivatizerStrategy, StepContext
from dpbench.privatizers.clipping import automatic_clip_factors, clipping_stats
from dpbench.privatizers.gaussian_projection import GaussianProjection
from dpbench.privatizers.implicit_projection import ImplicitProjection
from dpbench.privatizers.per_sample import (
    PerSampleEngine,
    check_engine,
    engine_state_bytes,
    make_engine,
    trainable_parameters,
)
from dpbench.privatizers.per_sample.precision import model_forward


@dataclass
class D2P2Config:
    name: str = "d2p2"
    dim: int | None = 1024
    """p, the projection dimension (cost O(d p) per step); null: no projection (D2P-SGD)."""
    gamma: float = 0.01
    """Stability constant of automatic clipping C g / (||g|| + gamma); C is privacy.clip_norm."""
    noise_decay: str = "inverse_sqrt"
    """inverse_sqrt (sigma / sqrt(k)) | exponential (down to sigma / decay_rate at the last step) | none."""
    decay_rate: float = 10.0
    clip_after_projection: bool = False
    """Clip each sample's projected gradient (sensitivity C: plain Gaussian accounting) instead of before it."""
    buckets: int = 12
    """Distinct noise levels the accountant composes (each run of steps charged at its smallest noise)."""
    engine: str = "auto"
    """auto | hooks | functorch: see dpbench.privatizers.per_sample.make_engine."""
    chunk_size: int | None = None
    projection: str = "auto"
    """auto | implicit | explicit. implicit: draw the update A y / sqrt(p) from its exact law without forming A,
    O(d + p) per step; the output's law, hence the privacy and the accounting, is the explicit path's. explicit:
    regenerate A from seeds block by block, O(d p); needed by clip_after_projection (per-sample projections).
    auto: implicit unless clip_after_projection."""
    max_block_elements: int = 1 << 20
    """Largest block of the explicit projection matrix held at once (float32 entries)."""


@dataclass
class D2PSGDConfig(D2P2Config):
    name: str = "d2p_sgd"
    dim: int | None = None


@dataclass
class DP2SGDConfig(D2P2Config):
    name: str = "dp2_sgd"
    noise_decay: str = "none"


PROJECTIONS = ("auto", "implicit", "explicit")


class D2P2(PrivatizerStrategy):
    name = "d2p2"
    supports_mixed_precision = True
    config: D2P2Config
    supports_data_parallel = False  # noises outside noised_sum: one rank's noise would not be shared

    engine: PerSampleEngine

    def __init__(self, config: Any, privacy: PrivacySettings):
        super().__init__(config, privacy)
        if not (math.isfinite(config.gamma) and config.gamma > 0):
            raise ConfigurationError(f"privatizer.gamma must be positive (it keeps norms below C), got {config.gamma}")
        if config.buckets < 1:
            raise ConfigurationError(f"privatizer.buckets must be at least 1, got {config.buckets}")
        if config.dim is not None and config.dim < 1:
            raise ConfigurationError(f"privatizer.dim must be positive or null (no projection), got {config.dim}")
        if config.clip_after_projection and config.dim is None:
            raise ConfigurationError("privatizer.clip_after_projection needs a projection: set privatizer.dim")
        if config.projection not in PROJECTIONS:
            raise ConfigurationError(f"privatizer.projection must be one of {PROJECTIONS}, got {config.projection!r}")
        if config.clip_after_projection and config.projection == "implicit":
            raise ConfigurationError("privatizer.clip_after_projection projects each sample: use projection=explicit")
        self.schedule = NoiseSchedule(config.noise_decay, config.decay_rate)
        self.planned_steps: int | None = None
        self.check_variant()

    def check_variant(self) -> None:
        """Variants refuse settings that would make them another algorithm under their name."""

    @property
    def implicit(self) -> bool:
        """Whether the update is sampled without A (`projection`, auto resolved); only with a projection."""
        config = self.config
        return config.dim is not None and not config.clip_after_projection and config.projection != "explicit"

    # -- privacy ---------------------------------------------------------------------------------------------
    def prepare(self, model: nn.Module, steps: int, delta: float, epsilon: float | None, accountant: Any) -> None:
        self.planned_steps = steps

    def _steps(self) -> int:
        if self.planned_steps is None:
            raise RuntimeError("the run length is unknown: the privacy plan calls prepare(model, steps, ...) first")
        return self.planned_steps

    def mechanism(self, sigma: float) -> Mechanism:
        """One step at noise multiplier sigma: random projected sensitivity unless clipped after projection."""
        if self.config.dim is not None and not self.config.clip_after_projection:
            return SubsampledGaussianMixture(self.privacy.sampling_rate, sigma, self.config.dim, -1.0)
        return SubsampledGaussian(self.privacy.sampling_rate, sigma)

    def composition(self, noise_multiplier: float, steps: int) -> Composition:
        runs, start = [], 0
        for end, factor in self.schedule.buckets(steps, self.config.buckets):
            runs.append((self.mechanism(noise_multiplier * factor), end - start))
            start = end
        return runs

    def step_mechanisms(self, step: int) -> list[Mechanism]:
        """The bucket's mechanism, so that the ledger composes the planned (bucketed) composition."""
        total, k = self._steps(), step + 1
        if k > total:  # past the plan: this step's own noise
            return [self.mechanism(self.noise_multiplier * self.schedule.factor(k, total))]
        runs = self.schedule.buckets(total, self.config.buckets)
        _, factor = runs[bisect.bisect_left([end for end, _ in runs], k)]
        return [self.mechanism(self.noise_multiplier * factor)]

    def step_noise_multiplier(self, step: int) -> float:
        """sigma_k of the 0-based logical step: the noise actually added (never below its bucket's)."""
        return self.noise_multiplier * self.schedule.factor(step + 1, self._steps())

    def privacy_report(self, steps: int, delta: float) -> dict[str, Any]:
        return {
            "noise_decay": self.config.noise_decay,
            "final_noise_multiplier": self.step_noise_multiplier(max(steps - 1, 0)),
            "projection_dim": self.config.dim,
            "projection": None if self.config.dim is None else "implicit" if self.implicit else "explicit",
            "accounting": "chi-square mixture (projection before noise)"
            if self.config.dim is not None and not self.config.clip_after_projection else "gaussian",
        }

    # -- before anything runs ---------------------------------------------------------------------------------
    def preflight(self, model: nn.Module, optimizer_config: Any | None) -> None:
        super().preflight(model, optimizer_config)
        check_engine(model, self.config.engine)
        dimensions = sum(p.numel() for p in trainable_parameters(model).values())
        if self.config.dim is not None and self.config.dim >= dimensions:
            raise ConfigurationError(
                f"privatizer.dim={self.config.dim} is not below the model's {dimensions:,} trainable parameters: the "
                f"projection reduces nothing, and the run would not be {self.name}; set privatizer.dim below "
                f"{dimensions:,}, or privatizer=d2p_sgd (no projection)")
        if self.config.dim is None and self.name == "d2p2":
            raise ConfigurationError("privatizer=d2p2 with dim=null does not project: that is privatizer=d2p_sgd "
                                     "(automatic clipping and decaying noise), named for what it is")

    def per_sample_state_bytes(self, model: nn.Module, micro_batch: int, activation_bytes: int) -> int:
        return engine_state_bytes(model, self.config.engine, self.config.chunk_size, micro_batch, activation_bytes)

    def method_details(self, model: nn.Module) -> dict[str, Any]:
        return {"projection_dim": self.config.dim,
                "trainable_parameters": sum(p.numel() for p in trainable_parameters(model).values())}

    # -- training --------------------------------------------------------------------------------------------
    def attach(self, model: nn.Module) -> None:
        self.engine = make_engine(model, self.config.engine, self.config.chunk_size, self.checks)
        shapes = {name: param.shape for name, param in trainable_parameters(model).items()}
        self.projection: GaussianProjection | ImplicitProjection | None = None
        if self.implicit:
            self.projection = ImplicitProjection(shapes, self.config.dim)
        elif self.config.dim is not None:
            self.projection = GaussianProjection(
                shapes, self.config.dim, self.privacy.randomness, self.config.max_block_elements
            )
        self._sums: dict[str, Tensor] = {}
        self._projected_sum: Tensor | None = None

    def accumulate(self, model: nn.Module, task: Task, batch: Batch, ctx: StepContext) -> tuple[float, dict]:
        if batch_size_of(batch) == 0:  # an empty Poisson batch is still a step: noise only
            return 0.0, {"batch_size": 0.0}
        factor_fn = partial(automatic_clip_factors, gamma=self.config.gamma)
        if self.config.clip_after_projection:
            projected = self.projection.project(self.engine.per_sample_gradients(task, batch), ctx.step)
            norms = projected.norm(dim=1)
            projected = torch.where(torch.isfinite(norms)[:, None], projected, torch.zeros((), device=norms.device))
            contribution = factor_fn(norms, self.privacy.clip_norm) @ projected
            self._projected_sum = contribution if self._projected_sum is None else self._projected_sum + contribution
            with torch.no_grad(), model_forward():
                losses = task.per_sample_loss(model, batch)
        else:
            result = self.engine.clipped_sum(task, batch, self.privacy.clip_norm, factor_fn)
            for name, grad in result.grads.items():
                self._sums[name] = self._sums[name] + grad if name in self._sums else grad
            norms, losses = result.norms, result.losses
        stats = clipping_stats(norms, self.privacy.clip_norm)
        stats.pop("clipped_fraction", None)  # automatic clipping rescales every sample
        return float(losses.sum()), stats

    def finalize(self, model: nn.Module, ctx: StepContext) -> None:
        std = self.step_noise_multiplier(ctx.step) * self.privacy.clip_norm
        params = trainable_parameters(model)
        if self.projection is None:
            grads = {}
            for name, param in params.items():
                noise = self.noise.normal_like(param, std)
                grads[name] = noise + self._sums[name].to(param.dtype) if name in self._sums else noise
        else:
            grads = self._projected_update(next(iter(params.values())).device, std, ctx.step)
        for name, param in params.items():
            param.grad = grads[name].to(param.dtype).div_(ctx.expected_batch_size)
        self._sums, self._projected_sum = {}, None

    def _projected_update(self, device: torch.device, std: float, step: int) -> dict[str, Tensor]:
        """A (A^T s / sqrt(p) + z) / sqrt(p), z ~ N(0, std^2 I_p) from the checkpointed noise stream (either path)."""
        if isinstance(self.projection, ImplicitProjection):
            return self.projection.release(self._sums, self.noise, std, device)
        noise = self.noise.on(device).normal((self.config.dim,)).mul_(std)
        return self.projection.back(self._projected(device, step) + noise, step)

    def _projected(self, device: torch.device, step: int) -> Tensor:
        """A^T s / sqrt(p) on the explicit path: the sum projected now, or the clipped projected samples' sum."""
        if self.config.clip_after_projection or not self._sums:
            return torch.zeros(self.config.dim, device=device) if self._projected_sum is None else self._projected_sum
        return self.projection.project(self._sums, step)


class D2PSGD(D2P2):
    """Algorithm 2: automatic clipping and decaying noise, no projection."""

    name = "d2p_sgd"
    config: D2PSGDConfig

    def check_variant(self) -> None:
        if self.config.dim is not None:
            raise ConfigurationError("privatizer=d2p_sgd does not project: leave dim null, or use privatizer=d2p2")


class DP2SGD(D2P2):
    """Algorithm 3: automatic clipping and projection, constant noise."""

    name = "dp2_sgd"
    config: DP2SGDConfig

    def check_variant(self) -> None:
        if self.config.dim is None or self.config.noise_decay != "none":
            raise ConfigurationError(
                "privatizer=dp2_sgd projects with constant noise: set dim and noise_decay=none, or use privatizer=d2p2"
            )
