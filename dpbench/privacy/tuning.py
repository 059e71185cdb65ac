"""The privacy of tuning: Papernot & Steinke's private selection (ICLR 2022), accounted with Google's dp-accounting.

A tuning that runs a random number K of trials, each a DP mechanism (a training run plus its noisy validation score),
and releases only the best one costs far less than K composed runs, provided K is drawn from one of the paper's
distributions (truncated negative binomial, logarithmic, geometric, Poisson) with randomness the adversary never
sees. dp-accounting's `RepeatAndSelectDpEvent` bounds its Renyi DP (Theorems 2 and 6); composed with the final run
trained at the winner's hyperparameters, `RdpAccountant` gives the epsilon of the whole release.

The trial's score is composed with its training run rather than taking the larger of the two (the validation split
is disjoint from the training split): under add/remove adjacency the split itself moves, so composition is the bound
that holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant
from scipy import optimize

from dpbench.errors import ConfigurationError
from dpbench.privacy.accountant import merge_composition
from dpbench.privacy.mechanisms import Composition, SubsampledGaussian

ORDERS = (*range(2, 257), 512, 1024)
"""Integer Renyi orders: there the subsampled Gaussian's RDP is an exact finite sum (dp-accounting's series for
fractional orders near 1 may fail to converge and drop the order), and Theorem 2's second order ranges over them."""
SHAPES = {0.0: "logarithmic", 1.0: "geometric", math.inf: "Poisson"}
"""dp-accounting's named shapes; any other positive shape is a truncated negative binomial."""


@dataclass(frozen=True)
class TrialCount:
    """The law of the number of trials: its mean and dp-accounting's shape (0, 1, inf, or a positive eta)."""

    mean: float
    shape: float

    def __post_init__(self) -> None:
        if isinstance(self.mean, bool) or not isinstance(self.mean, int | float) or not math.isfinite(self.mean) \
                or self.mean < 1:
            raise ConfigurationError(f"the mean number of tuning trials must be a finite number >= 1 (a tuning runs "
                                     f"at least one trial on average), got {self.mean!r}")
        if isinstance(self.shape, bool) or not isinstance(self.shape, int | float) or math.isnan(self.shape) \
                or self.shape < 0:
            raise ConfigurationError(
                f"the shape of the number of tuning trials must be 0 (logarithmic), 1 (geometric), inf (Poisson) or "
                f"another positive number (truncated negative binomial), got {self.shape!r}")

    @property
    def name(self) -> str:
        return SHAPES.get(float(self.shape), f"truncated negative binomial (eta={self.shape:g})")

    def gamma(self) -> float:
        """The success probability of the truncated law with this mean, never below the exact root: the draws'
        mean is then at most `mean`, and dp-accounting's own (lower) root can only over-state the privacy loss."""
        if self.shape == math.inf:
            raise ValueError("the Poisson law has no gamma")
        if self.shape == 1:
            return 1.0 / self.mean
        if self.mean == 1:
            return 1.0
        root = optimize.brentq(lambda g: truncated_mean(g, self.shape) - self.mean, 1e-300, 1.0 - 1e-15,
                               xtol=1e-300, rtol=1e-15)
        while truncated_mean(root, self.shape) > self.mean:
            root = math.nextafter(root, 1.0)
        return root


def truncated_mean(gamma: float, shape: float) -> float:
    """E[K] of the truncated negative binomial (shape 0: logarithmic) with success probability gamma."""
    if gamma >= 1.0:
        return 1.0
    if shape == 0:
        return (1.0 - gamma) / (gamma * -math.log(gamma))
    return shape * (1.0 - gamma) / (gamma * -math.expm1(shape * math.log(gamma)))


def run_event(composition: Composition) -> dp_event.DpEvent:
    """A run's composition as a dp-accounting event: Poisson-subsampled Gaussian steps only (other mechanisms,
    JL's and D2P2's random-sensitivity mixtures or sparse's selection, have no event there)."""
    events = []
    for mechanism, count in merge_composition(composition):
        if type(mechanism) is not SubsampledGaussian:
            raise ConfigurationError(
                f"its steps are {mechanism.kind}, which dp-accounting cannot express (it is used here for "
                f"Poisson-subsampled Gaussian steps only)")
        step = dp_event.PoissonSampledDpEvent(mechanism.sampling_rate, dp_event.GaussianDpEvent(
            mechanism.noise_multiplier))
        events.append(dp_event.SelfComposedDpEvent(step, count))
    if not events:
        raise ConfigurationError("the run composes no private step: there is no privacy to account")
    return dp_event.ComposedDpEvent(events)


def subsampled_gaussian_run(sampling_rate: float, noise_multiplier: float, steps: int) -> Composition:
    """The composition of a plain DP-SGD run: T steps of a Gaussian at noise multiplier sigma over a Poisson sample."""
    return [(SubsampledGaussian(sampling_rate, noise_multiplier), steps)]


def trial_event(trial: Composition, score_noise_multiplier: float) -> dp_event.DpEvent:
    """One trial: its training run and its validation score released with Gaussian noise (in units of the score's
    sensitivity, e.g. 1/n for the accuracy over n validation examples)."""
    if not (math.isfinite(score_noise_multiplier) and score_noise_multiplier > 0):
        raise ConfigurationError(f"the validation score's noise multiplier must be positive and finite (an exact "
                                 f"score is not private), got {score_noise_multiplier!r}")
    return dp_event.ComposedDpEvent([run_event(trial), dp_event.GaussianDpEvent(score_noise_multiplier)])


@dataclass(frozen=True)
class TuningEpsilon:
    """Epsilons at one delta, all from the same RDP accountant, so that they compare."""

    per_run: float
    """The final run alone."""
    tuning: float
    """The private selection alone: every trial run, only the winner released."""
    with_tuning: float
    """The selection composed with the final run: what releasing the final model costs."""
    delta: float


def _epsilon(event: dp_event.DpEvent, delta: float) -> float:
    return float(RdpAccountant(ORDERS).compose(event).get_epsilon(delta))


def tuning_epsilon(trial: Composition, final: Composition, trials: TrialCount, delta: float,
                   score_noise_multiplier: float) -> TuningEpsilon:
    """The epsilon of the final run alone, of the private selection over trials of `trial`, and of both."""
    if not 0.0 < delta < 1.0:
        raise ConfigurationError(f"delta must lie in (0, 1), got {delta}")
    selection = dp_event.RepeatAndSelectDpEvent(trial_event(trial, score_noise_multiplier), float(trials.mean),
                                                float(trials.shape))
    final_event = run_event(final)
    return TuningEpsilon(
        per_run=_epsilon(final_event, delta), tuning=_epsilon(selection, delta),
        with_tuning=_epsilon(dp_event.ComposedDpEvent([selection, final_event]), delta), delta=delta,
    )
