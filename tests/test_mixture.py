"""The random-sensitivity (chi-square mixture) PRV against an independent integral, and its guarantees."""

import math

import pytest
from scipy import integrate, optimize, stats

from dpbench.privacy import PrivacyAccountant, SubsampledGaussian
from dpbench.privacy.mixture import SubsampledGaussianMixture


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


def test_heavy_tails_give_infinite_epsilon_not_a_finite_lie():
    mechanism = SubsampledGaussianMixture(0.01, 0.6, 1, 1.0)
    assert mechanism.tail_mass() > 0.1  # a JL estimate from one projection is often far too small
    report = PrivacyAccountant().epsilon([(mechanism, 1500)], 1e-5)
    assert report.epsilon == math.inf
    assert PrivacyAccountant.rdp_epsilon([(mechanism, 1500)], 1e-5) == math.inf
