"""The random-sensitivity (chi-square mixture) PRV against an independent integral, and its guarantees."""

import math

import numpy as np
import pytest
from scipy import integrate, optimize, special, stats

from dpbench.privacy import PrivacyAccountant, SubsampledGaussian
from dpbench.privacy.mixture import MAX_LOSS_CAP, SubsampledGaussianMixture, capped_prv
from dpbench.privacy.subsampling import log_sum_exp


def gaussian_delta(mu: float, eps: float) -> float:
    return stats.norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * stats.norm.cdf(-mu / 2 - eps / mu)


def exact_mixture_delta(sigma: float, df: int, exponent: float, eps: float) -> float:
    """One full-batch step, scale revealed (Theorem B.7): delta = E_W[delta_Gauss(mu = 1 / (sigma W^(e/2)))]."""
    law = stats.chi2(df)

    def integrand(x: float) -> float:
        w = x / df
        return law.pdf(x) * gaussian_delta(1.0 / (sigma * w ** (exponent / 2)), eps)

    return integrate.quad(integrand, 0, math.inf, limit=400)[0]


@pytest.mark.parametrize("df,exponent", [(40, 1.0), (20, -1.0)])
def test_one_step_upper_bounds_and_tracks_the_exact_mixture(df, exponent):
    sigma, delta = 1.5, 1e-5
    report = PrivacyAccountant().epsilon([(SubsampledGaussianMixture(1.0, sigma, df, exponent), 1)], delta)
    assert exact_mixture_delta(sigma, df, exponent, report.epsilon) <= delta
    exact = optimize.brentq(lambda e: exact_mixture_delta(sigma, df, exponent, e) - delta, 0.01, 60)
    assert exact <= report.epsilon <= exact * 1.1 + 0.05


def test_epsilon_falls_with_the_dimension_towards_the_plain_gaussian():
    q, sigma, steps, delta = 0.02, 1.0, 300, 1e-5
    accountant = PrivacyAccountant(eps_error=0.02)
    plain = accountant.epsilon([(SubsampledGaussian(q, sigma), steps)], delta).epsilon
    curve = [
        accountant.epsilon([(SubsampledGaussianMixture(q, sigma, r, 1.0), steps)], delta).epsilon
        for r in (20, 60, 300, 3000)
    ]
    assert all(a > b for a, b in zip(curve, curve[1:], strict=False))
    assert curve[-1] >= plain and curve[-1] == pytest.approx(plain, rel=0.05)


def loss_tail(level: float, q: float, sigma: float, df: int) -> float:
    """P[loss > level] of one JL step (exponent +1) under the exact chi-square law, by quadrature over chi2_df."""
    # a component with noise s passes the level at output s^2 z + 1/2, z = log((e^level - (1 - q)) / q)
    z = level + math.log(-math.expm1(math.log1p(-q) - level)) - math.log(q)

    def integrand(x: float) -> float:
        s = sigma * math.sqrt(x / df)
        return stats.chi2.pdf(x, df) * (q * stats.norm.sf(s * z - 0.5 / s) + (1 - q) * stats.norm.sf(s * z + 0.5 / s))

    breaks = [0.0, *(stats.chi2.ppf(p, df) for p in (1e-15, 1e-12, 1e-9, 1e-6, 1e-3, 0.5)), math.inf]
    return sum(integrate.quad(integrand, a, b, limit=200)[0] for a, b in zip(breaks, breaks[1:], strict=False))


def test_the_cap_spends_the_budget_on_losses_that_really_exceed_it():
    """The mass moved to +inf is the chi-square mixture's own mass above the cap (a little more: bins are pessimistic),
    and it fits the budget; below the cap the law is a distribution that ends at the cap."""
    q, sigma, df, budget = 0.05, 1.0, 5, 1e-8
    prv = SubsampledGaussianMixture(q, sigma, df, 1.0).accounting_prv(budget)
    exact = loss_tail(prv.loss_cap, q, sigma, df)
    assert exact <= prv.pm_inf <= budget * 1.001
    assert prv.pm_inf == pytest.approx(exact, rel=0.15)
    assert prv.sf(prv.loss_cap) == 0.0 and prv.sf(prv.floor - 1.0) == 1.0
    grid = np.linspace(prv.floor - 1.0, prv.loss_cap + 1.0, 400_001)
    assert prv.probability(grid[:-1], grid[1:]).sum() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("df,sigma", [(5, 1.0), (30, 0.6)])
def test_finite_part_mean_and_moments_agree_with_its_survival_function(df, sigma):
    """mean() (Simpson in the Gaussian's coordinate) against the integral of the survival function; rdp() bounds the
    moment generating function of the finite part from above."""
    prv = SubsampledGaussianMixture(0.02, sigma, df, 1.0).accounting_prv(1e-9)
    near, bulk = prv.floor + np.geomspace(1e-15, 1e-2, 20_000), np.linspace(prv.floor + 1e-2, 30.0, 600_001)
    t = np.concatenate([near, bulk[bulk < prv.loss_cap], np.linspace(min(30.0, prv.loss_cap), prv.loss_cap, 200_001)])
    sf = prv.sf(t)
    assert prv.mean() == pytest.approx(prv.floor + np.trapezoid(sf, t), rel=1e-4, abs=1e-8)
    masses = np.concatenate([[1 - sf[0]], -np.diff(sf)])
    points = np.concatenate([[prv.floor], (t[1:] + t[:-1]) / 2])
    for alpha in (1.01, 1.5, 3.0):
        log_mgf = special.logsumexp((alpha - 1) * points, b=np.maximum(masses, 0.0))
        assert prv.rdp(alpha) >= log_mgf / (alpha - 1)


def test_one_projection_gives_infinite_epsilon_not_a_finite_lie():
    """r = 1 at Figure 3's setting: even keeping losses up to MAX_LOSS_CAP, the mass beyond it exceeds delta."""
    mechanism, steps, delta = SubsampledGaussianMixture(0.01, 0.6, 1, 1.0), 1500, 1e-5
    prv = mechanism.accounting_prv(delta / steps)
    assert prv.loss_cap == MAX_LOSS_CAP
    assert steps * loss_tail(MAX_LOSS_CAP, 0.01, 0.6, 1) > delta  # the true mass past the cap, not the bins'
    report = PrivacyAccountant().epsilon([(mechanism, steps)], delta)
    assert report.epsilon == math.inf and "infinite privacy loss" in report.fallback_reason
    assert PrivacyAccountant.rdp_epsilon([(mechanism, steps)], delta) == math.inf


def test_small_dimension_is_finite_and_large_where_the_old_cut_said_infinite():
    """q = 0.05, sigma = 1, r = 5, one step: a whole-component cut at effective sigma 0.2 reported inf; the true
    epsilon is about 21 (independent quadrature in tests/privacy/test_jl_accounting.py)."""
    report = PrivacyAccountant().epsilon([(SubsampledGaussianMixture(0.05, 1.0, 5, 1.0), 1)], 1e-5)
    assert report.method == "prv" and 20.0 < report.epsilon < 23.0


def test_rdp_curve_in_one_pass_equals_one_order_at_a_time_and_the_closed_sum():
    """The accountant's orders filled in one vectorised pass (chunks of orders) give what asking each order alone
    gives, and at integer orders never exceed Mironov, Talwar and Zhang's closed sum over the mixture's components."""
    mechanism = SubsampledGaussianMixture(0.02, 1.0, 30, 1.0)
    orders = (1.001, 1.5, 2.0, 3.0, 7.5, *range(8, 64))
    batch = mechanism.accounting_prv(1e-9)
    batch.prefill_rdp(orders)
    alone = {alpha: capped_prv(batch.q, batch.sigmas, batch.weights, batch.revealed_mass, 1e-9).rdp(alpha)
             for alpha in orders}
    assert [batch.rdp(alpha) for alpha in orders] == pytest.approx([alone[alpha] for alpha in orders], rel=1e-12)
    for n in (2, 3, 17, 63):
        j = np.arange(n + 1)
        terms = (special.gammaln(n + 1) - special.gammaln(j + 1) - special.gammaln(n - j + 1) + j * np.log(batch.q)
                 + (n - j) * np.log1p(-batch.q) + j * (j - 1) / (2 * batch.sigmas[:, None] ** 2))
        moment = np.logaddexp(special.logsumexp(special.logsumexp(terms, axis=1), b=batch.weights),
                              np.log((1 - batch.q) * batch.revealed_mass) + (n - 1) * batch.floor)
        assert batch.rdp(float(n)) <= (moment - np.log1p(-batch.pm_inf)) / (n - 1) * (1 + 1e-9)


def test_log_sum_exp_is_scipys_logsumexp():
    """The accountant's own log-sum-exp (speed) against scipy's, with weights and rows whose terms are all -inf."""
    rng = np.random.default_rng(0)
    values = rng.normal(scale=300.0, size=(7, 40))
    values[2] = -np.inf
    values[4, ::3] = -np.inf
    weights = rng.uniform(0.0, 2.0, size=(1, 40))
    for axis in (0, 1):
        np.testing.assert_allclose(log_sum_exp(values, axis=axis), special.logsumexp(values, axis=axis), rtol=1e-13)
    np.testing.assert_allclose(log_sum_exp(values, axis=1, weights=weights),
                               special.logsumexp(values, axis=1, b=weights), rtol=1e-13)


@pytest.mark.parametrize("exponent", [1.0, -1.0])
def test_effective_sigma_and_its_tail_follow_scipys_chi_square(exponent):
    """The chi-square law by scipy's special functions equals scipy.stats.chi2's ppf/isf and cdf/sf."""
    df, sigma = 10, 1.3
    mechanism = SubsampledGaussianMixture(0.1, sigma, df, exponent)
    tails = np.array([1e-12, 1e-6, 0.01, 0.3, 0.7])
    law = stats.chi2(df)
    scale = (law.ppf(tails) if exponent > 0 else law.isf(tails)) / df
    np.testing.assert_allclose(mechanism.effective_sigma(tails), sigma * scale ** (exponent / 2), rtol=1e-12)
    np.testing.assert_allclose(mechanism.tail_probability(mechanism.effective_sigma(tails)), tails, rtol=1e-9)
