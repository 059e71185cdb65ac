"""Private tuning's accounting against Papernot & Steinke's Theorem 2 computed by hand, and its secret draws."""

import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats

from dpbench.core.errors import ConfigurationError
from dpbench.privacy.mechanisms import SubsampledGaussian
from dpbench.privacy.mixture import SubsampledGaussianMixture
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privacy.rdp_curve import CurveRdpAccountant, curve_event
from dpbench.privacy.sparse_step_accounting import SubsampledSelectionGaussian
from dpbench.privacy.tuning import ORDERS as TUNING_ORDERS
from dpbench.privacy.tuning import TrialCount, subsampled_gaussian_run, tuning_epsilon
from dpbench.privacy.tuning_draws import draw_trial_count, noisy_score
from tests.helpers.rdp_reference import sampled_gaussian_rdp

DELTA = 1e-5
TRIAL = (500 / 4500, 2.4, 180)  # (q, sigma, T) of one trial: the CNN task's batch of 500 over 4,500 examples
FINAL = (0.1, 2.4, 200)  # the final run over all 5,000
SCORE_SIGMA = 10.0
MEAN, ETA = 10.0, 0.5
ORDERS = np.array(TUNING_ORDERS)  # Theorem 2 by hand at the accountant's orders


def theorem2(rdp: np.ndarray, orders: np.ndarray, mean: float, eta: float, gamma: float) -> np.ndarray:
    """Papernot & Steinke, Theorem 2: RDP at lambda of the best of K ~ TNB(eta, gamma) runs, minimised over the
    second order lambda-hat."""
    second = np.min((1 + eta) * (1 - 1 / orders) * rdp + (1 + eta) * math.log(1 / gamma) / orders)
    return rdp + second + math.log(mean) / (orders - 1)


def mironov_epsilon(rdp: np.ndarray, orders: np.ndarray, delta: float) -> float:
    """The standard conversion (Mironov 2017, Proposition 3)."""
    return float(np.min(rdp + math.log(1 / delta) / (orders - 1)))


def improved_epsilon(rdp: np.ndarray, orders: np.ndarray, delta: float) -> float:
    """Canonne, Kamath & Steinke (2020), Proposition 12: the conversion dp-accounting applies."""
    return float(np.min(rdp + np.log1p(-1 / orders) - np.log(delta * orders) / (orders - 1)))


def test_composition_matches_theorem_2_computed_by_hand():
    q, sigma, steps = TRIAL
    trial = steps * sampled_gaussian_rdp(q, sigma, ORDERS) + ORDERS / (2 * SCORE_SIGMA**2)  # + the noisy score
    final = FINAL[2] * sampled_gaussian_rdp(FINAL[0], FINAL[1], ORDERS)
    gamma = ((1 + math.sqrt(1 + 8 * MEAN)) / (4 * MEAN)) ** 2  # eta = 1/2: the mean is (1 + sqrt(gamma)) / (2 gamma)
    selection = theorem2(trial, ORDERS, MEAN, ETA, gamma)

    ours = tuning_epsilon(subsampled_gaussian_run(*TRIAL), subsampled_gaussian_run(*FINAL), TrialCount(MEAN, ETA),
                          DELTA, SCORE_SIGMA)
    by_hand = [improved_epsilon(rdp, ORDERS, DELTA) for rdp in (final, selection, selection + final)]
    figures = [ours.per_run, ours.tuning, ours.with_tuning]
    assert figures == pytest.approx(by_hand, rel=1e-6)
    standard = [mironov_epsilon(rdp, ORDERS, DELTA) for rdp in (final, selection, selection + final)]
    assert all(figure <= loose for figure, loose in zip(figures, standard, strict=True))
    # the selection costs far less than its mean number of trials composed
    composed = improved_epsilon(MEAN * trial + final, ORDERS, DELTA)
    assert ours.per_run < ours.with_tuning < composed


@pytest.mark.parametrize("mechanism", [
    SubsampledGaussianMixture(0.1, 3.0, 10, 1.0),  # JL: the chi-square's lower tail is the dangerous one
    SubsampledGaussianMixture(0.1, 1.5, 50, -1.0),  # D2P2: its upper tail
], ids=["jl", "d2p2"])
def test_truncated_mixture_rdp_bounds_the_conditioned_law_integrated_directly(mechanism):
    """The step's Renyi moment, integrated over the chi-square law with its dangerous tail of mass 1e-6 left out
    (scipy's quadrature, in the tail probability's logarithm), never exceeds dpbench's binned bound, which stays
    close to it."""
    tail, orders = 1e-6, np.array([2, 3, 4, 8])
    law, q = stats.chi2(mechanism.df), mechanism.sampling_rate

    def moment(log_u: float, order: int) -> float:
        u = math.exp(log_u)
        chi2 = law.ppf(u) if mechanism.exponent > 0 else law.isf(u)
        sigma = mechanism.noise_multiplier * (chi2 / mechanism.df) ** (mechanism.exponent / 2)
        return math.exp((order - 1) * sampled_gaussian_rdp(q, sigma, [order])[0]) * u

    exact = np.array([math.log(integrate.quad(moment, math.log(tail), 0.0, args=(order,), limit=500)[0]
                               / (1 - tail)) / (order - 1) for order in orders])
    ours = mechanism.truncated_rdp(orders, tail)
    assert np.all(ours >= exact * (1 - 1e-6)) and np.all(ours <= 1.15 * exact)
    # a lighter cut costs more at the orders the tail dominates
    assert mechanism.truncated_rdp(orders, 1e-9)[-1] > ours[-1]


@pytest.mark.parametrize("projected", [
    SubsampledGaussianMixture(*TRIAL[:2], 9958, -1.0),  # DP2 / D2P2's projection at p = 0.3 d
    SubsampledGaussianMixture(TRIAL[0], 2.6, 30, 1.0),  # JL at r = 30
], ids=["d2p2", "jl_r30"])
def test_random_sensitivity_runs_pay_their_left_out_tail_in_delta(projected):
    """JL's and D2P2's runs: the selection's epsilon from the truncated curves by Theorem 2 by hand, at the delta that
    is left once the tail's total variation (1 + e^epsilon) beta is paid; it is the smallest such epsilon."""
    final_step = SubsampledGaussianMixture(FINAL[0], projected.noise_multiplier, projected.df, projected.exponent)
    trial, final = [(projected, TRIAL[2])], [(final_step, FINAL[2])]
    ours = tuning_epsilon(trial, final, TrialCount(MEAN, 1), DELTA, SCORE_SIGMA)
    assert 0 < ours.tail_mass < DELTA
    orders = ORDERS
    trial_rdp = TRIAL[2] * projected.truncated_rdp(orders, ours.tail_mass) + orders / (2 * SCORE_SIGMA**2)
    final_rdp = FINAL[2] * final_step.truncated_rdp(orders, ours.tail_mass)
    total = theorem2(trial_rdp, orders, MEAN, 1.0, 1 / MEAN) + final_rdp
    beta = (MEAN * TRIAL[2] + FINAL[2]) * ours.tail_mass  # expected random-sensitivity steps, union bound
    epsilon = ours.with_tuning
    left = DELTA - (1 + math.exp(epsilon)) * beta
    assert 0 < left < DELTA
    assert improved_epsilon(total, orders, left) <= epsilon * (1 + 1e-9)  # (epsilon, DELTA)-DP holds
    assert improved_epsilon(total, orders, left) >= epsilon / (1 + 1e-5)  # and it is the fixed point, not a loose one
    plain = tuning_epsilon(subsampled_gaussian_run(TRIAL[0], projected.noise_multiplier, TRIAL[2]),
                           subsampled_gaussian_run(FINAL[0], projected.noise_multiplier, FINAL[2]),
                           TrialCount(MEAN, 1), DELTA, SCORE_SIGMA)
    assert ours.per_run < ours.with_tuning < ours.tuning + ours.per_run
    assert plain.with_tuning < ours.with_tuning < plain.with_tuning + 1.0  # a random sensitivity costs some more


def test_an_rdp_curve_that_is_not_a_bound_is_refused():
    """dp-accounting's conversion reads a NaN order as epsilon 0: a NaN, a negative value or a curve of the wrong
    length never becomes an event, and a curve at other orders is not composed."""
    good = np.linspace(0.1, 10.0, len(ORDERS))
    for bad in (np.where(ORDERS == 3, np.nan, good), -good, good[:-1]):
        with pytest.raises(ValueError, match="one non-negative value"):
            curve_event(TUNING_ORDERS, bad)
    elsewhere = curve_event((2.0, 3.0), np.array([0.1, 0.2]))
    assert not CurveRdpAccountant(TUNING_ORDERS).supports(elsewhere)
    assert CurveRdpAccountant(TUNING_ORDERS).supports(curve_event(TUNING_ORDERS, good))


def test_more_trials_and_a_heavier_law_cost_more():
    trial, final = subsampled_gaussian_run(*TRIAL), subsampled_gaussian_run(*FINAL)
    few = tuning_epsilon(trial, final, TrialCount(3, 1), DELTA, SCORE_SIGMA).with_tuning
    many = tuning_epsilon(trial, final, TrialCount(30, 1), DELTA, SCORE_SIGMA).with_tuning
    logarithmic = tuning_epsilon(trial, final, TrialCount(30, 0), DELTA, SCORE_SIGMA).with_tuning
    assert few < many and logarithmic < many


@pytest.mark.parametrize("mean, shape, message", [
    (0, 1, "mean number of tuning trials"), (-2, 1, "mean number of tuning trials"),
    (0.5, math.inf, "mean number of tuning trials"), (math.nan, 1, "mean number of tuning trials"),
    (10, -0.5, "shape"), (10, math.nan, "shape"), (10, "poisson", "shape"),
])
def test_bad_trial_laws_are_refused(mean, shape, message):
    with pytest.raises(ConfigurationError, match=message):
        TrialCount(mean, shape)


def test_exact_scores_and_unaccountable_runs_are_refused():
    final = subsampled_gaussian_run(*FINAL)
    with pytest.raises(ConfigurationError, match="exact score is not private"):
        tuning_epsilon(subsampled_gaussian_run(*TRIAL), final, TrialCount(10, 1), DELTA, 0.0)
    sparse = [(SubsampledSelectionGaussian(0.1, 2.0, 0.1, 5), 100)]
    with pytest.raises(ConfigurationError, match="subsampled_selection_gaussian, which has no Renyi DP bound"):
        tuning_epsilon(sparse, final, TrialCount(10, 1), DELTA, SCORE_SIGMA)
    jl = [(SubsampledGaussianMixture(*TRIAL[:2], 10, 1.0), TRIAL[2])]  # r = 10 at the CNN's noise: chi2_10 near 0
    with pytest.raises(ConfigurationError, match="no finite epsilon at delta 1e-05"):
        tuning_epsilon(jl, final, TrialCount(10, 1), DELTA, SCORE_SIGMA)
    with pytest.raises(ConfigurationError, match="no private step"):
        tuning_epsilon([(SubsampledGaussian(0.0, 1.0), 10)], final, TrialCount(10, 1), DELTA, SCORE_SIGMA)


@pytest.mark.parametrize("shape", [0, 1, ETA, 3, math.inf])
def test_trial_counts_come_from_the_secret_randomness_with_the_stated_mean(shape):
    law = TrialCount(MEAN, shape)
    torch.manual_seed(0)
    np.random.seed(0)
    state = torch.get_rng_state(), np.random.get_state()[1].copy()
    draws = [draw_trial_count(PrivacyRandomness(seed=11), law, task) for task in range(3000)]
    assert torch.equal(torch.get_rng_state(), state[0]) and np.array_equal(np.random.get_state()[1], state[1])
    torch.manual_seed(1)  # another public seed: the same secret draws
    np.random.seed(1)
    assert draws == [draw_trial_count(PrivacyRandomness(seed=11), law, task) for task in range(3000)]
    assert draws != [draw_trial_count(PrivacyRandomness(seed=12), law, task) for task in range(3000)]
    assert min(draws) >= (0 if shape == math.inf else 1)
    assert np.mean(draws) == pytest.approx(MEAN, rel=0.15)
    assert len(set(draws)) > 5  # a random count, not the mean


def test_secure_rng_draws_differ_from_the_default_generator_and_repeat():
    law = TrialCount(MEAN, 1)
    secure = [draw_trial_count(PrivacyRandomness(seed=5, secure=True), law, k) for k in range(50)]
    assert secure == [draw_trial_count(PrivacyRandomness(seed=5, secure=True), law, k) for k in range(50)]
    assert secure != [draw_trial_count(PrivacyRandomness(seed=5), law, k) for k in range(50)]


def test_noisy_score_has_the_accounted_scale_and_its_own_key():
    randomness = PrivacyRandomness(seed=3)
    scores = np.array([noisy_score(randomness, 0.9, 500, SCORE_SIGMA, trial, 0) for trial in range(4000)])
    assert scores.mean() == pytest.approx(0.9, abs=0.002)
    assert scores.std() == pytest.approx(SCORE_SIGMA / 500, rel=0.05)  # sensitivity 1/n times the noise multiplier
    assert noisy_score(randomness, 0.9, 500, SCORE_SIGMA, 7, 0) == noisy_score(PrivacyRandomness(seed=3), 0.9, 500,
                                                                               SCORE_SIGMA, 7, 0)
    assert noisy_score(randomness, 0.9, 500, SCORE_SIGMA, 7, 1) != noisy_score(randomness, 0.9, 500, SCORE_SIGMA, 7, 0)
    with pytest.raises(ConfigurationError, match="at least one example"):
        noisy_score(randomness, 0.9, 0, SCORE_SIGMA, 0)
    with pytest.raises(ConfigurationError, match="noise multiplier"):
        noisy_score(randomness, 0.9, 500, 0.0, 0)
