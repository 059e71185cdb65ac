"""Noise multiplier for a target epsilon, under the run's whole composition.

The cheap RDP bound (an upper bound on the PRV epsilon) brackets the answer from above; a safeguarded secant
search in log-log space on a coarse PRV discretisation finds it, and a few fine evaluations polish it. Any
discretisation's upper bound is valid, so the coarse stage only saves time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from dpbench.privacy.accountant import PrivacyAccountant
from dpbench.privacy.mechanisms import Composition

SIGMA_MIN = 0.2
"""Smallest noise multiplier calibration returns: below it the PRV accounting of many steps falls back to RDP. A
target above what SIGMA_MIN spends is met at SIGMA_MIN, and the plan reports the floor (PrivacyPlan.floor_hit)."""
SIGMA_MAX = 1000.0
COARSE_EPS_ERROR = 0.05


class UnreachableEpsilonError(ValueError):
    """The target epsilon cannot be met by any noise multiplier dpbench allows."""


def _bisect_log(feasible: Callable[[float], bool], low: float, high: float, ratio: float) -> float:
    """Smallest sigma in [low, high] (to a factor `ratio`) with feasible(sigma); feasible(high) must hold."""
    while high / low > ratio:
        mid = math.sqrt(low * high)
        if feasible(mid):
            high = mid
        else:
            low = mid
    return high


def _refine(
    epsilon_at: Callable[[float], float], high: float, target: float, rel_tol: float, step: float,
    max_evaluations: int,
) -> float:
    """Smallest feasible sigma near `high`, found by walking to a bracket and a secant search in log-log space."""
    eps_high = epsilon_at(high)
    while eps_high > target:  # walk up until feasible
        if high >= SIGMA_MAX:
            raise UnreachableEpsilonError(f"epsilon={target} is unreachable even with noise multiplier {SIGMA_MAX:g}")
        high = min(SIGMA_MAX, high / step)
        eps_high = epsilon_at(high)
    low, eps_low = high, eps_high
    while eps_low <= target:  # walk down until infeasible
        if eps_low >= target * (1 - rel_tol):
            return low
        if low <= SIGMA_MIN:
            return SIGMA_MIN
        high, eps_high = low, eps_low
        low = max(SIGMA_MIN, low * step)
        eps_low = epsilon_at(low)
    log_target = math.log(target)
    for _ in range(max_evaluations):  # invariant: eps(low) > target >= eps(high)
        if eps_high >= target * (1 - rel_tol) or high / low < 1 + 1e-6:
            return high
        x_low, x_high = math.log(low), math.log(high)
        f_low = math.log(eps_low) - log_target if math.isfinite(eps_low) else 50.0
        f_high = math.log(max(eps_high, 1e-300)) - log_target
        x_new = x_high - f_high * (x_high - x_low) / (f_high - f_low)
        x_new = min(max(x_new, x_low + 0.05 * (x_high - x_low)), x_high - 0.05 * (x_high - x_low))
        sigma = math.exp(x_new)
        eps = epsilon_at(sigma)
        if eps <= target:
            high, eps_high = sigma, eps
        else:
            low, eps_low = sigma, eps
    return high


def calibrate_noise_multiplier(
    composition_for: Callable[[float], Composition],
    target_epsilon: float,
    delta: float,
    accountant: PrivacyAccountant | None = None,
    rel_tol: float = 0.005,
    max_evaluations: int = 30,
) -> float:
    """Noise multiplier whose composed epsilon lies in [target*(1-rel_tol), target] (or SIGMA_MIN if below).

    composition_for(sigma) gives the run's composition for a base noise multiplier sigma, so schedules (D2P2) and
    mixtures (JL) calibrate the same way as plain DP-SGD.
    """
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"privacy.epsilon must be a positive finite number, got {target_epsilon}")
    accountant = accountant or PrivacyAccountant()
    coarse = PrivacyAccountant(max(COARSE_EPS_ERROR, accountant.eps_error), accountant.delta_error_ratio)

    def fine_epsilon(sigma: float) -> float:
        return accountant.epsilon(composition_for(sigma), delta).epsilon

    def coarse_epsilon(sigma: float) -> float:
        return coarse.epsilon(composition_for(sigma), delta).epsilon

    def rdp_feasible(sigma: float) -> bool:
        return accountant.rdp_epsilon(composition_for(sigma), delta) <= target_epsilon

    if not rdp_feasible(SIGMA_MAX) and fine_epsilon(SIGMA_MAX) > target_epsilon:
        raise UnreachableEpsilonError(
            f"epsilon={target_epsilon} at delta={delta} is unreachable for this run even with noise multiplier "
            f"{SIGMA_MAX:g}"
        )
    high = _bisect_log(rdp_feasible, SIGMA_MIN, SIGMA_MAX, 1.001) if rdp_feasible(SIGMA_MAX) else SIGMA_MAX
    rough = _refine(coarse_epsilon, high, target_epsilon, 2 * rel_tol, 0.8, max_evaluations)
    return _refine(fine_epsilon, rough, target_epsilon, rel_tol, 0.99, max_evaluations)
