"""Noise multiplier for a target epsilon, under the run's whole composition.

The cheap RDP bound (an upper bound on the PRV epsilon) brackets the answer from above; a safeguarded secant
search in log-log space then needs only a handful of PRV evaluations.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from dpbench.privacy.accountant import PrivacyAccountant
from dpbench.privacy.mechanisms import Composition

SIGMA_MIN = 0.3
SIGMA_MAX = 1000.0


class UnreachableEpsilonError(ValueError):
    """The target epsilon cannot be met by any noise multiplier dpbench allows."""


def _bisect_log(predicate_feasible: Callable[[float], bool], low: float, high: float, ratio: float) -> float:
    """Smallest sigma in [low, high] (to a factor `ratio`) with predicate true; predicate(high) must hold."""
    while high / low > ratio:
        mid = math.sqrt(low * high)
        if predicate_feasible(mid):
            high = mid
        else:
            low = mid
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

    def prv_epsilon(sigma: float) -> float:
        return accountant.epsilon(composition_for(sigma), delta).epsilon

    def rdp_feasible(sigma: float) -> bool:
        return accountant.rdp_epsilon(composition_for(sigma), delta) <= target_epsilon

    if not rdp_feasible(SIGMA_MAX) and prv_epsilon(SIGMA_MAX) > target_epsilon:
        raise UnreachableEpsilonError(
            f"epsilon={target_epsilon} at delta={delta} is unreachable for this run even with noise multiplier "
            f"{SIGMA_MAX:g}: raise epsilon, lower the batch size or the number of steps"
        )
    high = _bisect_log(rdp_feasible, SIGMA_MIN, SIGMA_MAX, 1.001) if rdp_feasible(SIGMA_MAX) else SIGMA_MAX
    eps_high = prv_epsilon(high)
    if high == SIGMA_MIN and eps_high <= target_epsilon:
        return SIGMA_MIN
    low, eps_low = high, eps_high
    while eps_low <= target_epsilon:  # walk down until infeasible: the PRV bound is tighter than RDP
        if low <= SIGMA_MIN:
            return high if eps_high <= target_epsilon else SIGMA_MIN
        high, eps_high = low, eps_low
        low = max(SIGMA_MIN, low * 0.8)
        eps_low = prv_epsilon(low)
    # Invariant: eps(low) > target >= eps(high). Secant in (log sigma, log eps), Illinois-safeguarded.
    log_target = math.log(target_epsilon)
    for _ in range(max_evaluations):
        if eps_high >= target_epsilon * (1 - rel_tol) or high / low < 1 + 1e-6:
            return high
        x_low, x_high = math.log(low), math.log(high)
        f_low, f_high = math.log(eps_low) - log_target, math.log(max(eps_high, 1e-300)) - log_target
        x_new = x_high - f_high * (x_high - x_low) / (f_high - f_low)
        x_new = min(max(x_new, x_low + 0.05 * (x_high - x_low)), x_high - 0.05 * (x_high - x_low))
        sigma = math.exp(x_new)
        eps = prv_epsilon(sigma)
        if eps <= target_epsilon:
            high, eps_high = sigma, eps
        else:
            low, eps_low = sigma, eps
    return high
