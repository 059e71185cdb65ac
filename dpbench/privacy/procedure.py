"""The privacy of a whole benchmark procedure on one data set: its tuning trials and its final runs, all released.

A leaderboard cell's procedure runs K tuning trials (each a training run on the training split less a validation
split, and its validation score released with Gaussian noise), picks one by the noisy scores (post-processing), then
trains S final runs at the chosen point (one per evaluation seed) and releases each one's test metric. With K fixed
in advance and every score released, nothing here is a random-stopping selection, so Papernot & Steinke's bound does
not apply: the honest total is the plain composition of every trial, every noisy score and every final run. Exact
(unnoised) validation scores would not be covered by any composition of the training runs: the validation split is
private data too.

Composition uses dpbench's own accountant (PRV, RDP fallback), which expresses every strategy's steps (JL's and
D2P2's random sensitivities as their mixtures), so every method is accounted by the same law; a trial's score is a
Gaussian of noise multiplier z in units of its sensitivity (a Gaussian over the whole data: sampling rate 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from dpbench.core.errors import ConfigurationError
from dpbench.privacy.accounting import calibrate, epsilon
from dpbench.privacy.mechanisms import Composition, SubsampledGaussian


@dataclass(frozen=True)
class Procedure:
    """How many trials and final runs a procedure releases, and the noise of each trial's validation score."""

    trials: int
    finals: int
    score_noise_multiplier: float | None
    """None: no score is released (a score without a bound, e.g. a loss not capped per example, whose selection this
    does not account)."""

    def __post_init__(self) -> None:
        for name, count, least in (("trials", self.trials, 0), ("finals", self.finals, 1)):
            if isinstance(count, bool) or not isinstance(count, int) or count < least:
                raise ConfigurationError(f"a procedure's {name} must be an integer >= {least}, got {count!r}")
        noise = self.score_noise_multiplier
        if noise is not None and not (math.isfinite(noise) and noise > 0):
            raise ConfigurationError(f"the validation score's noise multiplier must be positive and finite (an exact "
                                     f"score is not private), got {self.score_noise_multiplier!r}")


def score_mechanism(noise_multiplier: float) -> SubsampledGaussian:
    """A validation score released with Gaussian noise: one Gaussian mechanism over the whole validation split."""
    return SubsampledGaussian(1.0, noise_multiplier)


def repeated(composition: Composition, times: int) -> Composition:
    return [(mechanism, count * times) for mechanism, count in composition]


def procedure_composition(trial: Composition, final: Composition, procedure: Procedure) -> Composition:
    """Every release of the procedure: K trials and their K noisy scores, then S final runs."""
    noise = procedure.score_noise_multiplier
    scores = [(score_mechanism(noise), procedure.trials)] if procedure.trials and noise is not None else []
    return [*repeated(trial, procedure.trials), *scores, *repeated(final, procedure.finals)]


def procedure_epsilon(trial: Composition, final: Composition, procedure: Procedure, delta: float,
                      eps_error: float = 0.01) -> float:
    """The total epsilon at delta: the accountant's upper bound on the whole composition."""
    return epsilon(procedure_composition(trial, final, procedure), delta, eps_error).epsilon


def calibrate_procedure(trial_for: Callable[[float], Composition], final_for: Callable[[float], Composition],
                        procedure: Procedure, target: float, delta: float, eps_error: float = 0.01) -> float:
    """The smallest noise multiplier sigma (shared by the trials and the final runs) whose whole procedure stays
    within the total `target`; raises UnreachableEpsilonError where no sigma up to the calibrator's limit does
    (e.g. the scores' noise alone spends more than the target)."""
    return calibrate(lambda sigma: procedure_composition(trial_for(sigma), final_for(sigma), procedure), target,
                     delta, eps_error)
