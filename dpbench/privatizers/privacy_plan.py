"""The privacy plan of a run, fixed before training: sampling rate, steps, noise multiplier, expected epsilon."""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass

from torch import nn

from dpbench.core.config import PrivacyConfig
from dpbench.core.errors import ConfigurationError
from dpbench.privacy.accountant import PrivacyAccountant
from dpbench.privacy.calibration import SIGMA_MAX, SIGMA_MIN, UnreachableEpsilonError, calibrate_noise_multiplier
from dpbench.privacy.ledger import DeclaredComposition
from dpbench.privatizers.base import PrivatizerStrategy

log = logging.getLogger(__name__)
SAMPLINGS = ("poisson", "shuffle")
FLOOR_SHORTFALL = 0.99
"""A calibrated run at the noise floor that plans less than this share of its target reports the floor."""
ADVISED_DELTA_EXPONENT = 1.1
"""A delta above 1/N^1.1 is warned of (the usual "delta well below 1/N"); at or above 1/N it is refused."""


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
    floor_hit: bool = False
    """Calibration stopped at its smallest noise multiplier (SIGMA_MIN): planned_epsilon is below the target."""

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
        raise ConfigurationError(f"privacy.epsilon must be a positive finite number, got {config.epsilon}"
                                 + ("; a run without privacy is privatizer=nonprivate"
                                    if config.epsilon is not None and config.epsilon == math.inf else ""))
    if config.noise_multiplier is not None and not (
        math.isfinite(config.noise_multiplier) and config.noise_multiplier > 0
    ):
        raise ConfigurationError(
            f"privacy.noise_multiplier must be positive (null = calibrate from epsilon), got {config.noise_multiplier}"
        )
    if config.noise_multiplier is None and config.epsilon is None:
        raise ConfigurationError("set privacy.epsilon (to calibrate the noise) or privacy.noise_multiplier")
    if config.max_epsilon is not None and not (config.max_epsilon > 0):
        raise ConfigurationError(f"privacy.max_epsilon must be positive or null (no limit), got {config.max_epsilon}")


def check_delta(config: PrivacyConfig, train_size: int) -> None:
    """delta at or above 1/N admits a mechanism that publishes a random training record outright ((0, 1/N)-DP):
    refused unless privacy.allow_large_delta; above 1/N^1.1 it is said in the log."""
    limit, advised = 1.0 / train_size, float(train_size) ** -ADVISED_DELTA_EXPONENT
    if config.delta >= limit and not config.allow_large_delta:
        raise ConfigurationError(
            f"privacy.delta={config.delta:g} is not below 1/N = {limit:.3g} (N = {train_size:,} training samples): "
            f"publishing a random training record outright meets such a guarantee; lower it (below 1/N^1.1 = "
            f"{advised:.3g}), or set privacy.allow_large_delta=true to run it anyway"
        )
    if config.delta > advised:
        log.warning(
            "privacy.delta=%g is above 1/N^1.1 = %.3g (1/N = %.3g, N = %d training samples): the guarantee is weak; "
            "the usual advice is a delta well below 1/N", config.delta, advised, limit, train_size,
        )


def noise_multiplier_source(config: PrivacyConfig) -> str:
    """Which setting decided the noise (results.json `noise_multiplier_source`): a fixed noise multiplier wins over
    privacy.epsilon, which is then a budget to stop at (stop_on_budget) or no target at all."""
    if config.noise_multiplier is None:
        return "calibrated to privacy.epsilon"
    if config.epsilon is None:
        return "fixed (privacy.noise_multiplier)"
    if config.stop_on_budget:
        return "fixed (privacy.noise_multiplier); privacy.epsilon is the budget it stops at (privacy.stop_on_budget)"
    return "fixed (privacy.noise_multiplier); privacy.epsilon is not a target: the run spends what this noise spends"


def declared_composition(strategy: PrivatizerStrategy, plan: PrivacyPlan) -> DeclaredComposition | None:
    """What the ledger of a run with this plan is checked against (None for a non-private run)."""
    if not plan.private:
        return None
    name = f"{strategy.name} ({type(strategy).__module__}.{type(strategy).__qualname__})"
    return DeclaredComposition(strategy.composition, plan.noise_multiplier, plan.steps, name)


def make_plan(
    strategy: PrivatizerStrategy,
    config: PrivacyConfig,
    sampling_rate: float,
    steps: int,
    model: nn.Module | None = None,
    train_size: int | None = None,
) -> PrivacyPlan:
    """Calibrate (or check) the noise for the whole run before the first step; sets the strategy's sigma.

    With `model`, the strategy first fixes what its mechanisms depend on besides sigma (strategy.prepare); with
    `train_size` (N), delta is checked against 1/N.
    """
    validate_privacy_config(config)
    if steps <= 0:
        raise ConfigurationError(f"the run has {steps} steps: raise epochs or max_steps")
    if not strategy.is_private:
        return PrivacyPlan(False, config.sampling, sampling_rate, steps, config.delta, None, None, None, False)
    if train_size is not None:
        check_delta(config, train_size)
    if config.epsilon is not None and config.max_epsilon is not None and config.epsilon > config.max_epsilon:
        raise ConfigurationError(
            f"privacy.epsilon={config.epsilon:g} is above privacy.max_epsilon={config.max_epsilon:g}, past anything "
            f"one would call private: lower it, or raise privacy.max_epsilon (null: no limit) to run it anyway"
        )
    accountant = PrivacyAccountant(eps_error=config.accountant_eps_error)
    if model is not None:
        strategy.prepare(model, steps, config.delta, config.epsilon, accountant)
    calibrated = config.noise_multiplier is None
    if calibrated:
        try:
            sigma = calibrate_noise_multiplier(
                lambda s: strategy.composition(s, steps), config.epsilon, config.delta, accountant
            )
        except UnreachableEpsilonError:
            advice = strategy.epsilon_advice(SIGMA_MAX, config.epsilon, steps, config.delta, accountant)
            raise ConfigurationError(
                f"privacy.epsilon={config.epsilon:g} at delta={config.delta:g} is unreachable for this run even with "
                f"noise multiplier {SIGMA_MAX:g}: "
                f"{advice or 'raise epsilon, lower the batch size or the number of steps'}"
            ) from None
    else:
        sigma = config.noise_multiplier
    planned = accountant.epsilon(strategy.composition(sigma, steps), config.delta).epsilon
    if not calibrated:
        refuse_unplanned_epsilon(strategy, config, planned, steps, accountant)
        if config.epsilon is not None and not config.stop_on_budget:
            log.warning(
                "privacy.noise_multiplier=%g wins over privacy.epsilon=%g: the noise is fixed, not calibrated, and the "
                "run plans epsilon %.4g over %d steps (privacy.noise_multiplier=null calibrates to privacy.epsilon, "
                "privacy.stop_on_budget=true stops at it; results.json: noise_multiplier_source)",
                sigma, config.epsilon, planned, steps,
            )
    floor_hit = calibrated and sigma <= SIGMA_MIN and planned < config.epsilon * FLOOR_SHORTFALL
    if floor_hit:
        log.warning(
            "calibration reached its smallest noise multiplier %g: the run plans epsilon %.4g, below the target %g "
            "(results.json: calibration_floor_hit)", SIGMA_MIN, planned, config.epsilon,
        )
    strategy.privacy.noise_multiplier = sigma
    return PrivacyPlan(True, config.sampling, sampling_rate, steps, config.delta, config.clip_norm, sigma,
                       planned, calibrated, floor_hit)


def refuse_unplanned_epsilon(
    strategy: PrivatizerStrategy, config: PrivacyConfig, planned: float, steps: int, accountant: PrivacyAccountant
) -> None:
    """A fixed noise multiplier whose whole-run epsilon is infinite or above privacy.max_epsilon must not train
    silently: refused unless opted in (stop_on_budget trains only the steps privacy.epsilon covers)."""
    if config.stop_on_budget and config.epsilon is not None:
        return
    sigma = config.noise_multiplier
    if not math.isfinite(planned):
        if config.allow_infinite_epsilon:
            log.warning("privacy.allow_infinite_epsilon: the run's planned epsilon is infinite (no guarantee)")
            return
        limit = math.inf if config.max_epsilon is None else config.max_epsilon
        advice = strategy.epsilon_advice(sigma, limit, steps, config.delta, accountant)
        raise ConfigurationError(
            f"the planned epsilon is infinite at privacy.noise_multiplier={sigma:g} over {steps} steps (delta "
            f"{config.delta:g}): {advice or 'raise the noise multiplier or set privacy.epsilon to calibrate it'}; "
            f"privacy.allow_infinite_epsilon=true runs it anyway"
        )
    if config.max_epsilon is not None and planned > config.max_epsilon:
        advice = strategy.epsilon_advice(sigma, config.max_epsilon, steps, config.delta, accountant)
        raise ConfigurationError(
            f"the planned epsilon {planned:.4g} at privacy.noise_multiplier={sigma:g} over {steps} steps is above "
            f"privacy.max_epsilon={config.max_epsilon:g}: "
            f"{advice or 'raise the noise multiplier or set privacy.epsilon to calibrate it'}; "
            f"privacy.max_epsilon=null runs it anyway"
        )
