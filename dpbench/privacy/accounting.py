"""Epsilon of a composition, and the noise multiplier that meets a target: the accountant every dpbench run uses.

A composition is a list of (Mechanism, steps) pairs, as `PrivatizerStrategy.composition(sigma, steps)` returns it.
"""

from __future__ import annotations

from collections.abc import Callable

from dpbench.privacy.accountant import EpsilonReport, PrivacyAccountant
from dpbench.privacy.calibration import calibrate_noise_multiplier
from dpbench.privacy.mechanisms import Composition


def epsilon(composition: Composition, delta: float, eps_error: float = 0.01) -> EpsilonReport:
    """The PRV accountant's upper bound on epsilon at `delta` (RDP when the PRV computation fails; the report says
    which, and why an epsilon is infinite)."""
    return PrivacyAccountant(eps_error=eps_error).epsilon(composition, delta)


def calibrate(composition_for: Callable[[float], Composition], target_epsilon: float, delta: float,
              eps_error: float = 0.01) -> float:
    """The smallest noise multiplier sigma whose composition `composition_for(sigma)` stays within target_epsilon;
    raises UnreachableEpsilonError (a ValueError) when no sigma up to 1000 does."""
    return calibrate_noise_multiplier(composition_for, target_epsilon, delta, PrivacyAccountant(eps_error=eps_error))
