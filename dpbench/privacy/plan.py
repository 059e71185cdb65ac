"""The privacy plan of a run, fixed before training: sampling rate, steps, noise multiplier, expected epsilon."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from torch import nn

from dpbench.config import PrivacyConfig
from dpbench.errors import ConfigurationError
from dpbench.privacy.accountant import PrivacyAccountant
from dpbench.privacy.calibration import UnreachableEpsilonError, calibrate_noise_multiplier
from dpbench.privatizers.base import PrivatizerStrategy

SAMPLINGS = ("poisson", "shuffle")


@dataclass
class PrivacyPlan:
    private: bool
    sampling: str
    sampling_rate: float
    steps: int
    delta: float
    clip_norm: float | None
    noise_multiplier: float | None
    planned_epsilon: float | None
    calibrated: bool

    def to_dict(self) -> dict:
        return asdict(self)


def validate_privacy_config(config: PrivacyConfig) -> None:
    if config.sampling not in SAMPLINGS:
        raise ConfigurationError(f"privacy.sampling must be one of {SAMPLINGS}, got {config.sampling!r}")
    if not (0.0 < config.delta < 1.0):
        raise ConfigurationError(f"privacy.delta must lie in (0, 1), got {config.delta}")
    if not (math.isfinite(config.clip_norm) and config.clip_norm > 0):
        raise ConfigurationError(f"privacy.clip_norm must be positive, got {config.clip_norm}")
    if config.epsilon is not None and not (math.isfinite(config.epsilon) and config.epsilon > 0):
        raise ConfigurationError(f"privacy.epsilon must be a positive finite number, got {config.epsilon}")
    if config.noise_multiplier is not None and not (
        math.isfinite(config.noise_multiplier) and config.noise_multiplier > 0
    ):
        raise ConfigurationError(
            f"privacy.noise_multiplier must be positive (null = calibrate from epsilon), got {config.noise_multiplier}"
        )
    if config.noise_multiplier is None and config.epsilon is None:
        raise ConfigurationError("set privacy.epsilon (to calibrate the noise) or privacy.noise_multiplier")


def make_plan(
    strategy: PrivatizerStrategy,
    config: PrivacyConfig,
    sampling_rate: float,
    steps: int,
    model: nn.Module | None = None,
) -> PrivacyPlan:
    """Calibrate (or check) the noise for the whole run before the first step; sets the strategy's sigma.

    With `model`, the strategy first fixes what its mechanisms depend on besides sigma (strategy.prepare).
    """
    validate_privacy_config(config)
    if steps <= 0:
        raise ConfigurationError(f"the run has {steps} steps: raise epochs or max_steps")
    if not strategy.is_private:
        return PrivacyPlan(False, config.sampling, sampling_rate, steps, config.delta, None, None, None, False)
    accountant = PrivacyAccountant(eps_error=config.accountant_eps_error)
    if model is not None:
        strategy.prepare(model, steps, config.delta, config.epsilon, accountant)
    calibrated = config.noise_multiplier is None
    if calibrated:
        try:
            sigma = calibrate_noise_multiplier(
                lambda s: strategy.composition(s, steps), config.epsilon, config.delta, accountant
            )
        except UnreachableEpsilonError as error:
            raise ConfigurationError(str(error)) from None
    else:
        sigma = config.noise_multiplier
    planned = accountant.epsilon(strategy.composition(sigma, steps), config.delta).epsilon
    strategy.privacy.noise_multiplier = sigma
    return PrivacyPlan(True, config.sampling, sampling_rate, steps, config.delta, config.clip_norm, sigma,
                       planned, calibrated)
