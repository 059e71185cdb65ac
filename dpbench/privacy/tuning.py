"""The privacy of tuning: Papernot & Steinke's private selection (ICLR 2022), accounted with Google's dp-accounting.

A tuning that runs a random number K of trials, each a DP mechanism (a training run plus its noisy validation score),
and releases only the best one costs far less than K composed runs, provided K is drawn from one of the paper's
distributions (truncated negative binomial, logarithmic, geometric, Poisson) with randomness the adversary never
sees. dp-accounting's `RepeatAndSelectDpEvent` bounds its Renyi DP (Theorems 2 and 6); composed with the final run
trained at the winner's hyperparameters, `RdpAccountant` gives the epsilon of the whole release. Every final run
whose outcome is released (one per evaluation seed) is a release on the same data: they compose, each one counted.

The trial's score is composed with its training run rather than taking the larger of the two (the validation split
is disjoint from the training split): under add/remove adjacency the split itself moves, so composition is the bound
that holds.

JL's and D2P2's steps (random sensitivity, `SubsampledGaussianMixture`) have no dp-accounting event, and JL's Renyi
moments are infinite at every order (its chi-square scale reaches 0). Their steps enter as RDP curves of the scale law
with its dangerous tail of mass eta left out (`truncated_rdp`, `RdpCurveDpEvent`). The release with every step's
scale conditioned on the rest is within total variation beta = eta x (expected number of such steps released, over
the E[K] trials and the final run: a union bound) of the real one; (epsilon, delta')-DP for the conditioned release
then gives (epsilon, delta' + (1 + e^epsilon) beta)-DP for the real one, and delta' is what the RDP conversion gets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from dp_accounting import dp_event
from scipy import optimize

from dpbench.core.errors import ConfigurationError
from dpbench.privacy.accountant import merge_composition
from dpbench.privacy.mechanisms import Composition, SubsampledGaussian
from dpbench.privacy.mixture import SubsampledGaussianMixture
from dpbench.privacy.rdp_curve import CurveRdpAccountant, curve_event

ORDERS = (*range(2, 65), 72, 80, 96, 112, 128, 160, 192, 224, 256, 512, 1024)
"""Integer Renyi orders: there the subsampled Gaussian's RDP is an exact finite sum (dp-accounting's series for
fractional orders near 1 may fail to converge and drop the order), and Theorem 2's second order ranges over them.
Every order up to 64, sparser beyond: for the CNN task's DP-SGD (epsilon 1, 3, 8), D2P2 and JL r = 30 runs the
epsilons with tuning (2.8 to 25) agree to 4 decimals with every integer order up to 256, at a third of the cost of
the random-sensitivity curves."""
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


TAIL_SHARES = tuple(10.0 ** -k for k in range(1, 16))
"""Candidate beta / delta for the left-out tails of random-sensitivity steps (beta above; delta pays (1 + e^epsilon)
beta), tried from the largest; the one giving the smallest epsilon with tuning is kept, and the search ends once two
smaller ones in a row do worse (the bound grows again as the cut moves into the tail)."""
FIXED_POINT_STEPS = 50
FIXED_POINT_SLACK = 1e-6
"""Relative step above the last epsilon, so that the search for epsilon >= its conversion at delta - (1 + e^epsilon)
beta ends."""
MAX_EXPONENT = 700.0
"""Past this epsilon e^epsilon overflows a float, and the bound is useless anyway."""


def check_accountable(composition: Composition) -> None:
    """Raise ConfigurationError where a run's steps have no RDP bound here (sparse's selections)."""
    merged = merge_composition(composition)
    if not merged:
        raise ConfigurationError("the run composes no private step: there is no privacy to account")
    for mechanism, _ in merged:
        if type(mechanism) not in (SubsampledGaussian, SubsampledGaussianMixture):
            raise ConfigurationError(
                f"its steps are {mechanism.kind}, which has no Renyi DP bound here (private tuning is accounted for "
                f"Poisson-subsampled Gaussian steps, with a fixed or a random sensitivity)")


def cut_steps(composition: Composition) -> int:
    """How many of a run's steps have a random sensitivity, each with a tail left out of its RDP curve."""
    return sum(count for mechanism, count in merge_composition(composition)
               if isinstance(mechanism, SubsampledGaussianMixture))


@lru_cache(maxsize=1024)  # D2P2: twelve noise buckets x trial and final runs x the tail shares tried
def _curve(mechanism: SubsampledGaussianMixture, tail_mass: float) -> dp_event.DpEvent:
    return curve_event(ORDERS, mechanism.truncated_rdp(np.array(ORDERS), tail_mass))


def run_event(composition: Composition, tail_mass: float = 0.0) -> dp_event.DpEvent:
    """A run's composition as a dp-accounting event: Poisson-subsampled Gaussian steps as themselves, random-
    sensitivity steps as their RDP curve with a tail of mass `tail_mass` left out (see the module docstring)."""
    check_accountable(composition)
    events = []
    for mechanism, count in merge_composition(composition):
        if isinstance(mechanism, SubsampledGaussianMixture):
            if not 0.0 < tail_mass < 1.0:
                raise ValueError(f"a random-sensitivity step needs a left-out tail mass in (0, 1), got {tail_mass}")
            step = _curve(mechanism, tail_mass)
        else:
            step = dp_event.PoissonSampledDpEvent(mechanism.sampling_rate, dp_event.GaussianDpEvent(
                mechanism.noise_multiplier))
        events.append(dp_event.SelfComposedDpEvent(step, count))
    return dp_event.ComposedDpEvent(events)


def subsampled_gaussian_run(sampling_rate: float, noise_multiplier: float, steps: int) -> Composition:
    """The composition of a plain DP-SGD run: T steps of a Gaussian at noise multiplier sigma over a Poisson sample."""
    return [(SubsampledGaussian(sampling_rate, noise_multiplier), steps)]


def trial_event(trial: Composition, score_noise_multiplier: float, tail_mass: float = 0.0) -> dp_event.DpEvent:
    """One trial: its training run and its validation score released with Gaussian noise (in units of the score's
    sensitivity, e.g. 1/n for the accuracy over n validation examples)."""
    if not (math.isfinite(score_noise_multiplier) and score_noise_multiplier > 0):
        raise ConfigurationError(f"the validation score's noise multiplier must be positive and finite (an exact "
                                 f"score is not private), got {score_noise_multiplier!r}")
    return dp_event.ComposedDpEvent([run_event(trial, tail_mass), dp_event.GaussianDpEvent(score_noise_multiplier)])


@dataclass(frozen=True)
class TuningEpsilon:
    """Epsilons at one delta, all from the same RDP accountant, so that they compare."""

    per_run: float
    """The final run alone."""
    tuning: float
    """The private selection alone: every trial run, only the winner released."""
    with_tuning: float
    """The selection composed with every final run: what releasing the final runs costs."""
    delta: float
    tail_mass: float = 0.0
    """The scale-law tail left out of each random-sensitivity step's RDP curve, paid for in delta (0: none)."""
    finals: int = 1
    """Final runs composed into `with_tuning`."""


def conditioned_epsilon(event: dp_event.DpEvent, delta: float, tail_probability: float) -> float:
    """An epsilon whose RDP conversion at delta - (1 + e^epsilon) tail_probability is at most itself (see the module
    docstring; tail_probability 0: the plain conversion); +inf where none is found."""
    accountant = CurveRdpAccountant(ORDERS).compose(event)
    epsilon = float(accountant.get_epsilon(delta))
    if tail_probability == 0.0:
        return epsilon
    for _ in range(FIXED_POINT_STEPS):
        if not epsilon < MAX_EXPONENT:
            return math.inf
        remaining = delta - (1.0 + math.exp(epsilon)) * tail_probability
        if remaining <= 0.0:
            return math.inf
        needed = float(accountant.get_epsilon(remaining))
        if needed <= epsilon:
            return epsilon
        epsilon = needed * (1.0 + FIXED_POINT_SLACK)
    return math.inf


def tuning_epsilon(trial: Composition, final: Composition, trials: TrialCount, delta: float,
                   score_noise_multiplier: float, finals: int = 1) -> TuningEpsilon:
    """The epsilon of one final run alone, of the private selection over trials of `trial`, and of the selection
    composed with `finals` final runs (each evaluation seed's run is released)."""
    if not 0.0 < delta < 1.0:
        raise ConfigurationError(f"delta must lie in (0, 1), got {delta}")
    if isinstance(finals, bool) or not isinstance(finals, int) or finals < 1:
        raise ConfigurationError(f"the number of final runs must be an integer >= 1, got {finals!r}")
    trial_cut, final_cut = cut_steps(trial), cut_steps(final)
    applications = trials.mean * trial_cut + finals * final_cut  # E[K] <= mean (TrialCount.gamma)

    def events(tail_mass: float) -> tuple[dp_event.DpEvent, dp_event.DpEvent]:
        selection = dp_event.RepeatAndSelectDpEvent(trial_event(trial, score_noise_multiplier, tail_mass),
                                                    float(trials.mean), float(trials.shape))
        return selection, dp_event.SelfComposedDpEvent(run_event(final, tail_mass), finals)

    best, best_tail, worse = math.inf, 0.0, 0
    for share in TAIL_SHARES if applications else (0.0,):
        tail_mass = share * delta / applications if applications else 0.0
        with_tuning = conditioned_epsilon(dp_event.ComposedDpEvent(list(events(tail_mass))), delta,
                                          applications * tail_mass)
        if with_tuning < best:
            best, best_tail, worse = with_tuning, tail_mass, 0
        elif math.isfinite(best):
            worse += 1
            if worse == 2:
                break
    if not math.isfinite(best):
        raise ConfigurationError(
            f"its Renyi DP bound gives no finite epsilon at delta {delta:g}: every cut of its random-sensitivity "
            f"steps' scale law either leaves Renyi moments too large or cuts off a tail whose charge, (1 + "
            f"e^epsilon) times its probability, exceeds delta (JL's chi-square scale near 0 at few projections); "
            f"more projections or more noise would bound it")
    selection = events(best_tail)[0]  # at the chosen tail (the curves are cached)
    return TuningEpsilon(
        per_run=conditioned_epsilon(run_event(final, best_tail), delta, final_cut * best_tail),
        tuning=conditioned_epsilon(selection, delta, trials.mean * trial_cut * best_tail),
        with_tuning=best, delta=delta, tail_mass=best_tail, finals=finals,
    )
